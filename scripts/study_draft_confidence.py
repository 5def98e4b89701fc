"""How long should a draft be? A teacher-forced study of the draft's confidence, for
``draft_confidence`` (dynamic draft length).

In greedy decoding the drafts the verifier accepts are the target's own tokens, so the draft
model run once over prompt + the target's output (teacher forcing) gives, at every output
position, whether its top token is the target's and its top probability there: along the
accepted path these are exactly what SD's drafter sees. A round starting at position t with a
draft-length rule is then replayed exactly (its drafts up to the first mismatch are accepted,
then one token from the target), and its cost taken from pass times: a target pass of n tokens
and a draft step. The rules compared: a fixed K, and "one draft, then on while the top
probability is above tau, up to cap" (what ``draft_confidence`` does). Costs by default are
the Zen 2 bench's (ms; ``--zen5`` for the Zen 5's); rates are printed relative to the best of
K = 1 and K = 2, per prompt type (geometric mean over the prompts).

    python scripts/study_draft_confidence.py [--zen5] [--rerun [--per-type 6]] [--data FILE]

Reads the saved teacher-forced run (``docs/bench/draft-confidence.json``: the first 6 prompts
of each type, the default pair, 128 tokens); ``--rerun`` makes it anew and writes it (needs the
default models: ``specdec models pull``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

# target pass ms by tokens in the pass, draft step ms (after a fully accepted round the draft
# catches up on two tokens: a dearer step)
ZEN2 = {1: 36.0, 2: 40.8, 3: 53.5, 4: 64.3, 5: 75.1, 6: 86.0, 7: 97.0, 8: 108.0, 9: 128.6}
ZEN2_DRAFT = (9.4, 11.3)
ZEN5 = {1: 12.3, 2: 13.8, 3: 15.0, 4: 17.6, 5: 20.2, 6: 23.5, 7: 26.8, 8: 30.1, 9: 33.5}
ZEN5_DRAFT = (3.3, 3.9)


def teacher_forced(per_type: int) -> list[dict]:
    """Per prompt: the target's greedy output, and at each of its positions whether the draft's
    top token matches it and the draft's top probability."""
    import torch

    from specdec import LLM, SamplingParams
    from specdec.bench.prompts import load_prompts
    from specdec.registry import DEFAULT_DRAFT, DEFAULT_TARGET

    llm = LLM(DEFAULT_TARGET, DEFAULT_DRAFT, "sd", num_threads=2, max_model_len=1024)
    draft = llm.decoder.drafter.model
    head_ids = getattr(draft, "head_ids", None)
    tok, out = llm.tokenizer, []
    for p in load_prompts(["code", "prose", "chat"], per_type):
        ids = tok.apply_chat_template(p["prompt"]) if p["chat"] else tok.encode(p["prompt"])
        gen = list(llm.generate([ids], SamplingParams(temperature=0, max_tokens=128))[0].token_ids)
        seq = torch.tensor([ids + gen])
        at = torch.arange(len(ids) - 1, seq.shape[1] - 1)[None, :]
        logits = draft.forward(seq, draft.new_cache(1, seq.shape[1] + 4), logits_at=at)[0]
        top, arg = torch.softmax(logits.float(), -1).max(-1)
        arg = head_ids[arg] if head_ids is not None else arg
        match = (arg == torch.tensor(gen)).tolist()
        conf = [round(c, 4) for c in top.tolist()]
        out.append({"id": p["id"], "type": p["type"], "match": match, "conf": conf})
        print(f"{p['id']}: draft's top token = target's at {sum(match) / len(match):.2f}")
    return out


def rate(seq: dict, rule, passes: dict, draft: tuple[float, float]) -> float:
    """Tokens/s of SD on this output under a draft-length rule(i, conf) -> 'go' | 'last'."""
    match, conf, n = seq["match"], seq["conf"], len(seq["match"])
    t, ms, full_before = 0, 0.0, False
    while t < n:
        k = 0
        while t + k < n:
            ms += draft[1] if k == 0 and full_before else draft[0]
            k += 1
            if rule(k - 1, conf[t + k - 1]) == "last":
                break
        accepted = next((i for i in range(k) if not match[t + i]), k)
        ms += passes[k + 1]
        full_before = accepted == k
        t += accepted + 1
    return n / ms * 1000


def fixed(k: int):
    return lambda i, c: "last" if i == k - 1 else "go"


def confident(cap: int, tau: float):
    return lambda i, c: "go" if c > tau and i < cap - 1 else "last"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-type", type=int, default=6)
    ap.add_argument("--zen5", action="store_true", help="the Zen 5's pass costs")
    ap.add_argument("--data", type=Path, default=Path("docs/bench/draft-confidence.json"))
    ap.add_argument("--rerun", action="store_true", help="run the models again, write --data")
    args = ap.parse_args()
    if args.rerun or not args.data.exists():
        data = teacher_forced(args.per_type)
        args.data.write_text(json.dumps(data))
    else:
        data = json.loads(args.data.read_text())
    passes, draft = (ZEN5, ZEN5_DRAFT) if args.zen5 else (ZEN2, ZEN2_DRAFT)
    for kind in ("code", "prose", "chat"):
        seqs = [s for s in data if s["type"] == kind]
        best = [
            max(rate(s, fixed(1), passes, draft), rate(s, fixed(2), passes, draft)) for s in seqs
        ]

        def rel(rule, seqs=seqs, best=best) -> float:
            return statistics.geometric_mean(
                [rate(s, rule, passes, draft) / b for s, b in zip(seqs, best)]
            )

        cells = [f"K={k} {rel(fixed(k)):.3f}" for k in (1, 2, 3)]
        cells += [
            f"cap {cap} tau {tau} {rel(confident(cap, tau)):.3f}"
            for cap in (4, 6, 8)
            for tau in (0.85, 0.9, 0.95)
        ]
        print(f"{kind:5} " + " | ".join(cells))


if __name__ == "__main__":
    main()
