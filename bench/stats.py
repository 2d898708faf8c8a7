"""Summaries of repeated measurements: median, min–max, p95, and how many samples.

Every figure in RESULTS.md is one :class:`Summary`, so a reader always sees the spread and the
sample count next to the median.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Summary:
    """Median, extremes and 95th percentile of ``n`` samples (all in the caller's unit)."""

    n: int
    median: float
    min: float
    max: float
    p95: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Summary:
        return cls(**{key: data[key] for key in ("n", "median", "min", "max", "p95")})


def summarize(samples: Iterable[float]) -> Summary | None:
    """The summary of ``samples``; None when there are none (the report says "not measured")."""
    values = sorted(float(v) for v in samples)
    if not values:
        return None
    return Summary(n=len(values), median=statistics.median(values), min=values[0],
                   max=values[-1], p95=percentile(values, 95))


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (p95 of 20 samples is the 19th)."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(math.ceil(pct / 100 * len(sorted_values)), 1)
    return sorted_values[rank - 1]
