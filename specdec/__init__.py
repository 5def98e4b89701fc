"""specdec: lossless speculative decoding (SD, n-gram, SSD) for LLMs on your own hardware."""

from specdec.llm import LLM
from specdec.logprobs import TokenLogprob
from specdec.outputs import RequestOutput
from specdec.sampling import SamplingParams
from specdec.scoring import ScoreOutput

__all__ = ["LLM", "RequestOutput", "SamplingParams", "ScoreOutput", "TokenLogprob"]
__version__ = "0.1.0"
