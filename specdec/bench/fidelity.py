"""How faithful each weight mode is to the file's own weights: teacher-forced agreement.

The reference is the model with its weights exactly as the file defines them, in fp32
(``dtype="float32"``: a GGUF file dequantized at load). Each other mode (``auto``: native
quantized weights with int8 activations; ``exact``: native weights with fp32 activations;
``bfloat16``) reads the same text, and at every position we compare its top-1 next token with
the reference's and its perplexity over the text. The text: the bench's prompts (prose and
instructions) and the source of ``specdec/verify.py`` (code), a few hundred tokens each.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from specdec.bench.prompts import PROMPTS_FILE

MODES = ("auto", "exact", "bfloat16")
MAX_TOKENS_PER_TEXT = 512


def fidelity_texts() -> list[str]:
    prompts = [e["prompt"] for e in json.loads(PROMPTS_FILE.read_text())]
    code = (Path(__file__).parents[1] / "verify.py").read_text()
    return ["\n\n".join(prompts), code]


@torch.inference_mode()
def teacher_forced(model, ids: list[int]) -> torch.Tensor:
    """Log-probabilities [T-1, V] of each next token given the text before it."""
    cache = model.new_cache(1, len(ids) + 1)
    logits = model.forward(torch.tensor([ids]), cache)[0, :-1].double()
    return torch.log_softmax(logits, dim=-1)


def compare(ref: torch.Tensor, other: torch.Tensor, ids: list[int]) -> dict:
    nxt = torch.tensor(ids[1:])
    agree = (ref.argmax(-1) == other.argmax(-1)).double().mean().item()
    nll_ref = -ref.gather(1, nxt[:, None]).mean().item()
    nll = -other.gather(1, nxt[:, None]).mean().item()
    return {
        "positions": len(nxt),
        "top1_agreement": agree,
        "perplexity": math.exp(nll),
        "reference_perplexity": math.exp(nll_ref),
        "perplexity_change": math.exp(nll - nll_ref) - 1,
    }


def fidelity_report(model: str, modes=MODES, threads: int | None = None) -> list[dict]:
    """One row per mode: top-1 agreement with the fp32 reference and perplexity, over all texts."""
    from specdec.model import Transformer
    from specdec.platform import pin_cpu_cores
    from specdec.registry import resolve_model
    from specdec.tokenizer import Tokenizer

    pin_cpu_cores(None, threads)
    folder = resolve_model(model)
    tok = Tokenizer(folder)
    texts = [tok.encode(t)[:MAX_TOKENS_PER_TEXT] for t in fidelity_texts()]
    reference = Transformer.from_path(folder, "float32")
    refs = [teacher_forced(reference, ids) for ids in texts]
    del reference
    rows = []
    for mode in modes:
        m = Transformer.from_path(folder, mode)
        per_text = [compare(r, teacher_forced(m, ids), ids) for r, ids in zip(refs, texts)]
        n = sum(p["positions"] for p in per_text)
        rows.append(
            {
                "mode": mode,
                "positions": n,
                "top1_agreement": sum(p["top1_agreement"] * p["positions"] for p in per_text) / n,
                "perplexity_change_by_text": [p["perplexity_change"] for p in per_text],
                "perplexity_by_text": [p["perplexity"] for p in per_text],
                "reference_perplexity_by_text": [p["reference_perplexity"] for p in per_text],
            }
        )
        del m
    return rows


def format_fidelity(rows: list[dict]) -> str:
    lines = ["mode       positions  top-1 vs fp32  perplexity (prose / code)  change vs fp32"]
    for r in rows:
        ppl = " / ".join(f"{p:.3f}" for p in r["perplexity_by_text"])
        ref = " / ".join(f"{p:.3f}" for p in r["reference_perplexity_by_text"])
        change = " / ".join(f"{c * 100:+.2f}%" for c in r["perplexity_change_by_text"])
        lines.append(
            f"{r['mode']:<10} {r['positions']:>9}  {r['top1_agreement'] * 100:12.2f}%  "
            f"{ppl:>25}  {change}   (fp32: {ref})"
        )
    return "\n".join(lines)
