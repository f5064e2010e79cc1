"""specdecode: lossless speculative decoding for Llama-family models."""

from specdecode.config import SamplingParams
from specdecode.llm import LLM, RequestOutput

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
