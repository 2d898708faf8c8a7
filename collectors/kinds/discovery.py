"""Which engine kind a container runs, from its labels, command line and image name.

The label ``sparkops.engine=<kind>`` decides first (``none`` opts a container out; a value that
is no kind SparkOps reads means "not an engine"); then the words of its command line, then its
image name, each tried against every kind in :data:`KINDS` order. Words are matched whole
(:func:`word_pattern`). Standard library only, so the container-engine seam can ask it without
importing the readers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

ENGINE_LABEL = "sparkops.engine"
OPT_OUT = "none"


def word_pattern(*names: str) -> re.Pattern[str]:
    """A pattern that finds one of ``names`` as a word of a command or image name: bounded by
    the start or end, a slash, dot, dash, underscore, colon or blank (``vllm`` in
    ``nvcr.io/nvidia/vllm:26.08``, not in ``openvllmish``)."""
    alternatives = "|".join(re.escape(name) for name in names)
    return re.compile(rf"(^|[/_.\-\s])({alternatives})([/_.:\-\s]|$)", re.IGNORECASE)


# Each kind's words, in the order kinds are tried: the program (`llama-swap`, `vllm`,
# `llama-server`, `ollama`, `sglang.launch_server`, `trtllm-serve`) and the names images carry
# (`ghcr.io/mostlygeek/llama-swap`, `nvcr.io/nvidia/vllm`, `ghcr.io/ggml-org/llama.cpp`,
# `ollama/ollama`, `lmsysorg/sglang`, `nvcr.io/nvidia/tensorrt-llm/release`). The router
# llama-swap comes first: its images also carry the engines it starts.
WORDS: dict[str, re.Pattern[str]] = {
    "llamaswap": word_pattern("llama-swap", "llamaswap", "llama_swap"),
    "vllm": word_pattern("vllm"),
    "llamacpp": word_pattern("llama-server", "llama.cpp", "llama-cpp", "llamacpp"),
    "ollama": word_pattern("ollama"),
    "sglang": word_pattern("sglang"),
    "trtllm": word_pattern("trtllm-serve", "tensorrt-llm", "tensorrt_llm"),
}
KINDS = tuple(WORDS)
# Label values people write for a kind, besides its own name.
ALIASES = {"llama-swap": "llamaswap", "llama.cpp": "llamacpp", "llama-cpp": "llamacpp",
           "llama-server": "llamacpp", "tensorrt-llm": "trtllm", "trtllm-serve": "trtllm",
           "tensorrt_llm": "trtllm"}


def runs(kind: str, words: Sequence[str]) -> bool:
    """Does any of ``words`` name ``kind``'s program or image?"""
    return any(WORDS[kind].search(word) for word in words)


def kind_of(labels: Mapping[str, str], command: Sequence[str], image: str) -> str | None:
    """The engine kind of a container, or None when it is not an engine."""
    label = (labels.get(ENGINE_LABEL) or "").strip().lower()
    if label:
        label = ALIASES.get(label, label)
        return label if label in WORDS else None
    for words in (command, [image]):
        for kind in KINDS:
            if runs(kind, words):
                return kind
    return None
