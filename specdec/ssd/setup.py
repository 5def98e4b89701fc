"""Assembling method="ssd": the worker's configuration, the handle, the drafter, the round."""

from __future__ import annotations

from specdec.config import DraftSpec, EngineConfig
from specdec.controller import SpeculationController
from specdec.decoders.speculative import SpeculativeDecoder
from specdec.drafters.ngram import NgramDrafter
from specdec.model import Transformer
from specdec.ssd.client import WorkerHandle
from specdec.ssd.drafter import SSDDrafter
from specdec.ssd.protocol import WorkerConfig
from specdec.tokenizer import Tokenizer


def build_ssd_decoder(
    config: EngineConfig, draft: DraftSpec, target: Transformer, tokenizer: Tokenizer
) -> SpeculativeDecoder:
    ssd = config.ssd
    k = config.num_speculative_tokens or ssd.max_k
    cores = ssd.draft_cpu_cores
    worker = WorkerConfig(
        draft_path=str(draft.path),
        dtype=str(draft.dtype).replace("torch.", ""),
        device=ssd.draft_device or config.device,
        quantization=draft.quantization,
        head_ids=None if draft.head_ids is None else draft.head_ids.tolist(),
        tokenizer_vocab=tokenizer.vocab_size,
        target_vocab=target.config.vocab_size,
        max_rows=1,  # resized with the target's cache (SSDDecoder.ensure_capacity)
        max_len=min(config.max_model_len or target.config.max_position_embeddings, 2048),
        k=k,
        budget=ssd.budget,
        saguaro_c=ssd.saguaro_c,
        sparse_q=64,
        cpu_cores=cores,
        num_threads=len(cores) if cores else None,
        host="127.0.0.1",
        port=0,
        tokenizer_path=str(tokenizer.folder),
        eos_token_ids=sorted(set(tokenizer.eos_token_ids) | set(target.config.eos_token_ids)),
    )
    handle = WorkerHandle(worker, reply_timeout_s=ssd.timeout_s)
    # K adapts as in SD (up to k), unless fixed: the cost the controller sees for drafting is
    # the target's wait for the worker (misses), so it lengthens K where hits make drafts free
    fixed = config.num_speculative_tokens
    controller = SpeculationController(
        k_max=k, fixed_k=fixed, k_min=1, explore=(k, 1, 2), lookahead=True
    )
    vocab = target.config.vocab_size
    drafter = SSDDrafter(
        handle, k, ssd.budget, ssd.fanout, ssd.backup, vocab, NgramDrafter(vocab), controller
    )
    return SSDDecoder(target, tokenizer.vocab_size, drafter, controller)


class SSDDecoder(SpeculativeDecoder):
    """The speculative round with the SSD drafter. The worker starts with the engine and
    resizes its cache whenever the target's does."""

    def __init__(self, target, vocab_size, drafter: SSDDrafter, controller):
        super().__init__(target, vocab_size, drafter, controller, method="ssd")
        drafter.handle.start(wait=True)

    def ensure_capacity(self, rows: int, max_len: int) -> None:
        super().ensure_capacity(rows, max_len)
        self.drafter.resize(self.cache.max_rows, self.cache.max_len)
