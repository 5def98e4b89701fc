"""Assembling method="ssd": the worker's configuration, the handle, the drafter, the round."""

from __future__ import annotations

from specdec.controller import SpeculationController
from specdec.decoders.speculative import SpeculativeDecoder
from specdec.drafters.ngram import NgramDrafter
from specdec.ssd.client import WorkerHandle
from specdec.ssd.drafter import BACKUPS, SSDDrafter
from specdec.ssd.fanout import FANOUTS
from specdec.ssd.protocol import WorkerConfig

DEFAULT_K = 4
# measured best of B = 1, 2, 4 on a 2-core CPU with the AVX-512 kernels (README); with AVX2 only,
# where a pass over several branches cost ~3x a one-token pass, B = 2 was
DEFAULT_BUDGET = 4
DEFAULT_C = 1.0


def build_ssd_decoder(llm, draft: dict, num_spec: int | None, opts: dict) -> SpeculativeDecoder:
    k = num_spec or DEFAULT_K
    budget = DEFAULT_BUDGET if opts["budget"] is None else opts["budget"]
    c = DEFAULT_C if opts["saguaro_c"] is None else opts["saguaro_c"]
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"speculation_budget must be an integer >= 1, got {budget!r}")
    if not isinstance(c, (int, float)) or not 0 < c <= 1:
        raise ValueError(f"saguaro_c must be in (0, 1], got {c!r}")
    if opts["fanout"] not in FANOUTS:
        raise ValueError(f"fanout must be one of {', '.join(FANOUTS)}, got {opts['fanout']!r}")
    if opts["backup"] not in BACKUPS:
        raise ValueError(f"backup must be one of {', '.join(BACKUPS)}, got {opts['backup']!r}")
    cores = opts["draft_cpu_cores"]
    head_ids = draft["head_ids"]
    config = WorkerConfig(
        draft_path=str(draft["path"]),
        dtype=str(llm.dtype).replace("torch.", ""),
        device=opts["draft_device"],
        quantization=draft["quantization"],
        head_ids=None if head_ids is None else head_ids.tolist(),
        tokenizer_vocab=llm.tokenizer.vocab_size,
        target_vocab=llm.target.config.vocab_size,
        max_rows=1,  # resized with the target's cache (SSDDecoder.ensure_capacity)
        max_len=min(llm.max_model_len, 2048),
        k=k,
        budget=budget,
        saguaro_c=float(c),
        sparse_q=64,
        cpu_cores=cores,
        num_threads=len(cores) if cores else None,
        host="127.0.0.1",
        port=0,
    )
    handle = WorkerHandle(config, reply_timeout_s=opts["timeout_s"])
    # K adapts as in SD (up to k), unless fixed: the cost the controller sees for drafting is
    # the target's wait for the worker (misses), so it lengthens K where hits make drafts free
    controller = SpeculationController(k_max=k, fixed_k=num_spec, k_min=1, explore=(k, 1, 2))
    fallback = NgramDrafter(llm.target.config.vocab_size)
    vocab = llm.target.config.vocab_size
    drafter = SSDDrafter(
        handle, k, budget, opts["fanout"], opts["backup"], vocab, fallback, controller
    )
    return SSDDecoder(llm.target, llm.tokenizer.vocab_size, drafter, controller)


class SSDDecoder(SpeculativeDecoder):
    """The speculative round with the SSD drafter. The worker starts with the engine and
    resizes its cache whenever the target's does."""

    def __init__(self, target, vocab_size, drafter: SSDDrafter, controller):
        super().__init__(target, vocab_size, drafter, controller, method="ssd")
        drafter.handle.start(wait=True)

    def ensure_capacity(self, rows: int, max_len: int) -> None:
        super().ensure_capacity(rows, max_len)
        self.drafter.resize(self.cache.max_rows, self.cache.max_len)
