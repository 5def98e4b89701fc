"""specdec: lossless speculative decoding (SD, n-gram, SSD) for LLMs on your own hardware."""

from specdec.llm import LLM
from specdec.outputs import RequestOutput
from specdec.sampling import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
