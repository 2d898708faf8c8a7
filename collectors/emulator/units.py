"""Number parsing and formatting the way vLLM does it.

vLLM's `human_readable_int` (vllm/engine/arg_utils.py; `--kv-cache-memory-bytes`,
`--max-model-len`, `--max-num-batched-tokens`):
a lower-case suffix is decimal (`1k` = 1000, `8g` = 8×10⁹, fractions allowed: `25.6k`), an
upper-case suffix is binary (`1K` = 1024, `8G` = 8×2³⁰, no fractions). So `131k` is 131000, not
131072 — the same surprise a real operator gets.
"""

from __future__ import annotations

import re

GIB = 1 << 30
MIB = 1 << 20

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def human_readable_int(text: str) -> int:
    """Parse `8G`, `512M`, `131k`, `25.6k` or a plain integer; raise ValueError otherwise."""
    text = text.strip()
    match = _HUMAN.fullmatch(text)
    if match is None:
        return int(text)
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise ValueError(
            f"Decimals are not allowed with binary suffixes like {suffix}. "
            f"Did you mean to use {number}{suffix.lower()} instead?"
        )
    return int(number) * _BINARY[suffix]


def gib(nbytes: float) -> float:
    """Bytes to GiB (2³⁰), the unit of every vLLM memory line."""
    return nbytes / GIB


def format_gib_2026(nbytes: float) -> str:
    """`format_gib` of 2026 vLLM: `str(round(x, 2))`, so `6.9` or `5.0`, not always 2 decimals."""
    return str(round(gib(nbytes), 2))
