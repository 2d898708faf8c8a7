"""A minimal Prometheus registry and its text exposition (format 0.0.4), standard library only.

The output mimics what `prometheus_client.generate_latest` produces for vLLM, because that is what
a real `/metrics` returns (vllm/entrypoints/serve/instrumentator/metrics.py):

* a counter declared as `vllm:prompt_tokens` is exposed as `vllm:prompt_tokens_total`, and its
  creation time as a separate gauge family `vllm:prompt_tokens_created`;
* a histogram exposes `_bucket` (cumulative, `le` last bound `+Inf`), `_count`, `_sum`, then its
  own `_created` gauge family;
* numbers are printed like Go's strconv (`1.0`, `1.7e+09`), as prometheus_client does;
* label order is either sorted (prometheus_client 0.26) or declaration order (older dumps).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence


def go_float(value: float) -> str:
    """Format a float as prometheus_client's `floatToGoString` does."""
    value = float(value)
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    # Go switches to exponent notation sooner than Python does.
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class Series:
    """One labelled time series: a counter or gauge value, or a histogram's buckets."""

    def __init__(self, buckets: Sequence[float] | None) -> None:
        self.value = 0.0
        self.created = time.time()
        self.bounds: tuple[float, ...] = tuple(buckets) if buckets is not None else ()
        self.bucket_counts = [0] * (len(self.bounds) + 1)  # last one is +Inf
        self.sum = 0.0
        self.count = 0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.value += amount

    def set(self, value: float) -> None:
        self.value = value

    def observe(self, value: float, times: int = 1) -> None:
        """Record `value` `times` times (one bucket search for all of them)."""
        index = len(self.bounds)
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                index = i
                break
        self.bucket_counts[index] += times
        self.sum += value * times
        self.count += times


class Family:
    """A metric family: name, type, help and its series keyed by label values."""

    def __init__(
        self,
        name: str,
        kind: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float] | None = None,
    ) -> None:
        if kind not in {"counter", "gauge", "histogram"}:
            raise ValueError(f"unsupported metric type {kind}")
        self.name = name
        self.kind = kind
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.buckets = tuple(float(b) for b in buckets) if buckets is not None else None
        self._series: dict[tuple[str, ...], Series] = {}

    def series(self, **labels: str) -> Series:
        """The series for these label values (all label names required), created on first use."""
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} needs labels {self.labelnames}, got {sorted(labels)}")
        key = tuple(labels[name] for name in self.labelnames)
        found = self._series.get(key)
        if found is None:
            found = Series(self.buckets if self.kind == "histogram" else None)
            self._series[key] = found
        return found

    def items(self) -> Iterable[tuple[dict[str, str], Series]]:
        for key, series in self._series.items():
            yield dict(zip(self.labelnames, key, strict=True)), series


def _sample(name: str, labels: dict[str, str], value: float, sort_labels: bool) -> str:
    pairs = sorted(labels.items()) if sort_labels else list(labels.items())
    if not pairs:
        return f"{name} {go_float(value)}"
    body = ",".join(f'{k}="{_escape_label(v)}"' for k, v in pairs)
    return f"{name}{{{body}}} {go_float(value)}"


def render_family(family: Family, sort_labels: bool, with_created: bool = True) -> list[str]:
    """The exposition lines of one family, `_created` group included for counters/histograms."""
    exposed = family.name + "_total" if family.kind == "counter" else family.name
    lines = [
        f"# HELP {exposed} {_escape_help(family.documentation)}",
        f"# TYPE {exposed} {family.kind}",
    ]
    created: list[str] = []
    for labels, series in family.items():
        if family.kind == "gauge":
            lines.append(_sample(family.name, labels, series.value, sort_labels))
            continue
        if family.kind == "counter":
            lines.append(_sample(exposed, labels, series.value, sort_labels))
        else:
            cumulative = 0
            bounds = [*series.bounds, math.inf]
            for bound, count in zip(bounds, series.bucket_counts, strict=True):
                cumulative += count
                bucket_labels = {**labels, "le": go_float(bound)}
                lines.append(
                    _sample(f"{family.name}_bucket", bucket_labels, cumulative, sort_labels)
                )
            lines.append(_sample(f"{family.name}_count", labels, series.count, sort_labels))
            lines.append(_sample(f"{family.name}_sum", labels, series.sum, sort_labels))
        created.append(_sample(f"{family.name}_created", labels, series.created, sort_labels))
    if created and with_created:
        lines.append(f"# HELP {family.name}_created {_escape_help(family.documentation)}")
        lines.append(f"# TYPE {family.name}_created gauge")
        lines.extend(created)
    return lines
