"""Reading a Prometheus text exposition of an engine that is not vLLM (SGLang, TensorRT-LLM),
all or nothing.

SGLang and ``trtllm-serve`` both serve ``prometheus_client``'s multiprocess collector
(``MultiProcessCollector``): counters are summed across the engine's processes and carry no
``_created`` series, there is no ``process_start_time_seconds``, and one quantity may be split
over several series by a label the engine adds (SGLang's ``is_streaming``, ``cache_source``,
``dp_rank``). :class:`Exposition` keeps every sample of the families a reader names and hands
them back summed over the series the reader asks for, so each reader states which labels it
adds up and which it filters on.

The text is read whole by :func:`collectors.promtext.samples` before anything is built, after
the same checks as vLLM's parse: a body that is empty or does not end with a line feed is
refused (a body cut in the middle of a line would otherwise parse with a wrong last value), and
every value used must be finite and non-negative; histograms must be cumulative with a ``+Inf``
bucket.

Cost: one regular expression per line (the plain reading of ``collectors.promtext``), one
pass over the samples kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from collectors import promtext
from collectors.kinds.http import one_line, parse_error
from collectors.vllm.metrics import Histogram

Select = Callable[[Mapping[str, str]], bool]


def _every(labels: Mapping[str, str]) -> bool:
    return True


@dataclass(frozen=True)
class _Sample:
    name: str
    labels: Mapping[str, str]
    value: float


class Exposition:
    """The samples of the families in ``wanted`` (sample names, with their suffixes) of one
    ``GET path`` body; :func:`parse` builds it."""

    def __init__(self, path: str, samples: Iterable[_Sample]) -> None:
        self.path = path
        self._samples: dict[str, list[_Sample]] = {}
        for sample in samples:
            self._samples.setdefault(sample.name, []).append(sample)

    def has(self, name: str) -> bool:
        return name in self._samples

    def total(self, name: str, select: Select = _every) -> float | None:
        """The sum of ``name`` over the series ``select`` keeps; None when it has none."""
        values = [s.value for s in self._samples.get(name, ()) if select(s.labels)]
        if not values:
            return None
        for value in values:
            self._check(name, value)
        return sum(values)

    def count(self, name: str, select: Select = _every) -> int | None:
        """:meth:`total` as a whole count (counters and gauges of requests or tokens)."""
        value = self.total(name, select)
        return None if value is None else int(round(value))

    def fraction(self, name: str, select: Select = _every) -> float | None:
        """The one value of a 0-1 gauge, averaged when several series (ranks) report it."""
        values = [s.value for s in self._samples.get(name, ()) if select(s.labels)]
        if not values:
            return None
        for value in values:
            self._check(name, value)
            if value > 1 + 1e-9:
                raise parse_error(f"GET {self.path}: invalid metrics: {name} is {value!r}, not "
                                  "a fraction 0-1")
        return min(sum(values) / len(values), 1.0)

    def labels(self, name: str) -> list[Mapping[str, str]]:
        """The label sets of ``name``'s series (an info gauge's configuration)."""
        return [s.labels for s in self._samples.get(name, ())]

    def histogram(self, base: str, select: Select = _every) -> Histogram | None:
        """``base``'s histogram, its series (split by ``is_streaming``, …) merged bucket by
        bucket; None when it has no buckets."""
        buckets: dict[float, float] = {}
        for sample in self._samples.get(f"{base}_bucket", ()):
            if not select(sample.labels):
                continue
            self._check(f"{base}_bucket", sample.value)
            try:
                bound = float(sample.labels.get("le", ""))
            except ValueError:
                raise parse_error(f"GET {self.path}: invalid metrics: {base}_bucket has le "
                                  f"{sample.labels.get('le')!r}") from None
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
        if not buckets:
            return None
        ordered = sorted(buckets.items())
        if ordered[-1][0] != math.inf:
            raise parse_error(f"GET {self.path}: invalid metrics: {base} has no +Inf bucket")
        counts = [n for _, n in ordered]
        if any(later < earlier for earlier, later in zip(counts, counts[1:], strict=False)):
            raise parse_error(f"GET {self.path}: invalid metrics: {base}'s buckets are not "
                              "cumulative")
        total = self.total(f"{base}_sum", select)
        count = int(round(ordered[-1][1]))
        return Histogram(buckets=tuple((bound, int(round(n))) for bound, n in ordered),
                         count=count, sum=total)

    def _check(self, name: str, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            raise parse_error(f"GET {self.path}: invalid metrics: {name} is {value!r}")


def parse(text: str, path: str, wanted: frozenset[str]) -> Exposition:
    """The samples of ``wanted`` in ``text`` (ScrapeError, kind "parse", when it is not a
    whole Prometheus text)."""
    if not text.strip():
        raise parse_error(f"GET {path}: not Prometheus text: the body is empty")
    if not text.endswith("\n"):
        raise parse_error(f"GET {path}: not Prometheus text: the last line does not end with a "
                          "line feed (the body was cut off?)")
    try:
        found = promtext.samples(text, wanted)
    except ValueError as error:
        raise parse_error(f"GET {path}: not Prometheus text: {one_line(str(error))}") from None
    return Exposition(path, (_Sample(name, labels, value) for name, labels, value in found))


def decode(body: bytes, path: str) -> str:
    """A body as UTF-8 text, or the reason it is not."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise parse_error(f"GET {path}: not Prometheus text: byte at offset {error.start} is "
                          "not UTF-8") from None


def histogram_names(*bases: str) -> set[str]:
    """Every sample name of the histograms ``bases``."""
    return {f"{base}{suffix}" for base in bases for suffix in ("_bucket", "_sum", "_count")}
