"""Sizes and rates, and how SparkOps writes them for people: the one place for both.

Binary units throughout (GiB = 2**30 bytes), as vLLM prints its memory figures and as
``/proc/meminfo`` counts (in KiB). A figure that is not known is written ``UNKNOWN``, never as
a number: a missing reading must not look like zero.

The emulator keeps its own copy of vLLM's size parser and log formats on purpose
(``collectors/emulator/units.py``): it runs on a bare ``python3`` inside a container and must
reproduce vLLM's text exactly.
"""

from __future__ import annotations

KIB = 1024
MIB = 1024**2
GIB = 1024**3
UNKNOWN = "unknown"


def gib(value: float | None, digits: int | None = None) -> float | None:
    """Bytes as GiB (rounded to ``digits`` when given); None stays None."""
    if value is None:
        return None
    return value / GIB if digits is None else round(value / GIB, digits)


def gib_text(value_gib: float | None) -> str:
    """GiB for people: two decimals under 10 GiB (where half a GiB matters), one above."""
    if value_gib is None:
        return UNKNOWN
    return f"{value_gib:.2f} GiB" if abs(value_gib) < 10 else f"{value_gib:.1f} GiB"


def bytes_text(value: float | None) -> str:
    """Bytes for people, in GiB as ``gib_text`` writes them."""
    return gib_text(gib(value))


def fixed_gib_text(value: float | None, digits: int = 2) -> str:
    """Bytes as GiB with a fixed number of decimals ("30.00 GiB"): for figures read side by
    side, where a changing precision would misalign them."""
    if value is None:
        return UNKNOWN
    return f"{value / GIB:.{digits}f} GiB"


def size_text(value: float | None) -> str:
    """Bytes for people at any scale: GiB with one decimal, MiB below 1 GiB (an emulated
    engine's scale), KiB below 1 MiB."""
    if value is None:
        return UNKNOWN
    if abs(value) >= GIB:
        return f"{value / GIB:.1f} GiB"
    if abs(value) >= MIB:
        return f"{value / MIB:.0f} MiB"
    return f"{value / KIB:.0f} KiB"


def exact_size_text(count: int) -> str:
    """A byte count in the largest binary unit that divides it exactly ("4 MiB", "1500 bytes"):
    for limits, where a rounded figure would misstate the rule."""
    for unit, factor in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if count >= factor and count % factor == 0:
            return f"{count // factor} {unit}"
    return f"{count} bytes"


def tps_text(tps: float | None) -> str:
    """Tokens per second for people: one decimal under 100 tok/s, whole numbers above."""
    if tps is None:
        return UNKNOWN
    return f"{tps:.1f} tok/s" if abs(tps) < 100 else f"{tps:,.0f} tok/s"
