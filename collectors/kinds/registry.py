"""The reader of every engine kind SparkOps reads, by ``Engine.kind``."""

from __future__ import annotations

from collectors.kinds.base import KindReader
from collectors.kinds.llamacpp import LlamaCppReader
from collectors.kinds.llamaswap import LlamaSwapReader
from collectors.kinds.ollama import OllamaReader
from collectors.kinds.sglang import SglangReader
from collectors.kinds.trtllm import TrtllmReader
from collectors.kinds.vllm import VllmReader

READERS: dict[str, KindReader] = {
    reader.kind: reader for reader in (VllmReader(), LlamaCppReader(), OllamaReader(),
                                       SglangReader(), TrtllmReader(),
                                       LlamaSwapReader())
}


def reader_for(kind: str) -> KindReader:
    """The reader of a stored ``Engine.kind`` (vLLM's for a kind this version does not know)."""
    return READERS.get(kind, READERS["vllm"])
