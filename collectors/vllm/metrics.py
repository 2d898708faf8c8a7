"""Parse a vLLM ``/metrics`` exposition into per-engine snapshots, all or nothing.

The text is read by :func:`collectors.promtext.samples` (``prometheus_client``'s parser, or a
plain reading that gives the same samples for the plain lines engines write), whole, before
anything is built, so a caller gets either every snapshot or :class:`MetricsParseError`.
Only the families SparkOps reads reach the parser (:func:`_used_lines`): a busy engine's
exposition is about 40 KB, mostly histograms SparkOps never reads, and parsing all of it cost
about 12 ms of CPU per engine and collection. A malformed line of a family SparkOps does not
read is therefore ignored rather than failing the scrape.
The parser checks syntax only (prometheus_client 0.26 accepts a negative counter, buckets that
are not cumulative, no ``+Inf`` bucket and a body without its final line feed), so the values we
use are checked here as well:
counts must be non-negative integers, the KV usage a fraction, histograms cumulative with a
``+Inf`` bucket, and the text must end with a line feed as the format requires (a body cut in
the middle of a line would otherwise parse, with a wrong last value).

Names follow vllm/v1/metrics/loggers.py of vLLM 0.33 and the names before vLLM PRs #18354,
#29330 and #32661 renamed them; each quantity is read from
the current name and, only when that is absent, from its older names. An engine is identified
by the ``model_name`` and ``engine`` labels; ``engine`` is missing in V0 (0.6-0.10,
vllm/engine/metrics.py) and in V1 0.7 (vllm/v1/metrics/loggers.py: ``labelnames =
["model_name"]``) and is then ``None``. The names, types, label sets and buckets of every minor
release 0.6-0.33 are checked in tests/test_vllm_releases.py against expositions rendered from
each release's own definitions (tests/fixtures/vllm_releases/).

Sleep mode (``vllm:engine_sleep_state``, one series per ``sleep_state`` of ``awake``,
``weights_offloaded`` and ``discard_all``, 0 or 1; vllm/v1/metrics/loggers.py:593 and
``record_sleep_state`` at 1335 of 0.33, present from 0.11) is read as ``asleep`` and
``sleep_level``. Speculative decoding is read from V1's counters (vllm/v1/spec_decode/metrics.py,
``SpecDecodingProm``: drafts, draft tokens, accepted tokens, and accepted tokens per draft
position, 0.8-0.33, only with ``--speculative-config``) and, for V0 engines (vllm/engine/metrics.py,
0.6-0.10), from its accepted and draft token counters and its two gauges, which V0 sets to NaN
before the first draft.

Cost: one regular expression over the text, which passes over the unused lines in runs, then
one regular expression per line kept (about 0.35 ms of CPU for a vLLM 0.33 scrape of 40 KB, from
0.6 ms when every line was filtered in Python and 1.7 ms in the prometheus_client parser), then
one pass over the samples.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from itertools import pairwise
from typing import Any, NamedTuple

from collectors import promtext

__all__ = [
    "Histogram",
    "MetricsParseError",
    "MetricsSnapshot",
    "parse_engines",
    "parse_metrics_text",
]

# Current name first, then older names of the same quantity (gpu_cache_usage_perc and
# gpu_prefix_cache_* were renamed by vLLM PR #18354 and dropped by PR #29330). As the releases
# define them: gpu_cache_usage_perc in V0 0.6-0.10 and V1 0.7-0.10, hidden in 0.11, gone from
# 0.12; kv_cache_usage_perc and prefix_cache_* 0.9-0.33 (vllm/v1/metrics/loggers.py). Both KV usage
# names are a fraction 0-1 despite "_perc": vLLM's help text says "1 means 100 percent usage"
# and vLLM's official Grafana dashboard (examples/observability/prometheus_grafana/grafana.json,
# "Cache Utilization") shows them with unit percentunit.
_GAUGE_NAMES: Mapping[str, tuple[str, ...]] = {
    "requests_running": ("vllm:num_requests_running",),
    "requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
# Counters are declared without "_total" but exposed with it, plus a "_created" twin
# (prometheus_client). The old gpu_prefix_cache_* counted blocks in 0.7/0.8 and tokens later; a
# hit *rate* is unaffected.
_COUNTER_NAMES: Mapping[str, tuple[str, ...]] = {
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "generation_tokens_total": ("vllm:generation_tokens_total",),
    "preemptions_total": ("vllm:num_preemptions_total",),
    "prefix_cache_queries_total": (
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
    ),
    "prefix_cache_hits_total": (
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_hits_total",
    ),
    # Speculative decoding counters exist only with --speculative-config
    # (vllm/v1/spec_decode/metrics.py).
    "spec_decode_drafts_total": ("vllm:spec_decode_num_drafts_total",),
    "spec_decode_draft_tokens_total": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_decode_accepted_tokens_total": ("vllm:spec_decode_num_accepted_tokens_total",),
}
# time_per_output_token_seconds was the inter-token latency under its old name; it is not
# request_time_per_output_token_seconds, which is a per-request mean (vLLM PR #24110). The old
# name: V0 0.6-0.10, V1 0.7-0.11, hidden 0.12-0.14, gone from 0.15; the new one 0.10-0.33.
_HISTOGRAM_NAMES: Mapping[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "inter_token_latency": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ),
}
# vllm:engine_sleep_state: 0.11-0.33 (vllm/v1/metrics/loggers.py), one series per sleep_state.
_SLEEP_STATE = "vllm:engine_sleep_state"
_SLEEP_LABEL = "sleep_state"
# Accepted tokens per draft position, one series per position "0".."k-1" (k =
# num_speculative_tokens); 0.8-0.33 (vllm/v1/spec_decode/metrics.py).
_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_POSITION_LABEL = "position"
# Series whose samples differ by one more label than model_name and engine (besides a
# histogram's le): the name and that label.
_LABELLED = {_SLEEP_STATE: _SLEEP_LABEL, _PER_POSITION: _POSITION_LABEL,
             _PER_POSITION.removesuffix("_total") + "_created": _POSITION_LABEL}
# V0's own speculative-decoding gauges (vllm/engine/metrics.py, 0.6-0.10): fractions since the
# engine started, NaN before its first draft (vllm/spec_decode/metrics.py).
_V0_SPEC_GAUGES: Mapping[str, str] = {
    "spec_decode_draft_acceptance_rate": "vllm:spec_decode_draft_acceptance_rate",
    "spec_decode_efficiency": "vllm:spec_decode_efficiency",
}
_CACHE_CONFIG = "vllm:cache_config_info"
_PROCESS_START = "process_start_time_seconds"
_KV_USAGE_SLACK = 1e-9
_REASON_LIMIT = 200

_EngineKey = tuple[str | None, str | None]


class MetricsParseError(Exception):
    """The text is not a usable vLLM exposition; ``reason`` says why in one line.

    Reasons start with "not Prometheus text:" (the format is broken), "not a vLLM /metrics
    endpoint:" (no vLLM engine metrics) or "invalid vLLM metrics:" (a value we use is
    impossible, such as a negative count or a histogram without its +Inf bucket).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram as exposed: cumulative counts per upper bound.

    ``buckets`` is sorted by bound and ends with ``(math.inf, count)``; ``count`` equals that
    last bucket. ``sum`` is None when the exposition had no ``_sum`` series.
    """

    buckets: tuple[tuple[float, int], ...]
    count: int
    sum: float | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form; bounds are strings as in the exposition ("0.25", "+Inf")."""
        return {
            "buckets": [[_format_bound(bound), count] for bound, count in self.buckets],
            "count": self.count,
            "sum": self.sum,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Histogram:
        """Inverse of :meth:`as_dict`."""
        return cls(
            buckets=tuple((float(bound), int(count)) for bound, count in data["buckets"]),
            count=int(data["count"]),
            sum=data.get("sum"),
        )


@dataclass(frozen=True)
class MetricsSnapshot:
    """What one scrape says about one vLLM engine. Every unknown value is None, never 0.

    * ``requests_waiting``: in vLLM 0.33 it counts waiting plus deferred requests.
    * ``kv_cache_usage``: fraction 0-1 of KV blocks in use.
    * ``*_total``: counters since the engine started; ``prompt_tokens_total`` includes prompt
      tokens served from the prefix cache (vLLM counts every prompt token).
    * ``ttft`` / ``inter_token_latency``: seconds, as cumulative histograms.
    * Capacity comes from the labels of ``vllm:cache_config_info`` (every CacheConfig field,
      vllm/config/cache.py:metrics_info, plus ``engine``), joined by the
      ``engine`` label because it has no ``model_name``; when that join is ambiguous (several
      models behind one endpoint) the capacity fields are None. ``kv_cache_size_tokens`` is the
      label when the version has it (group-aware, right for hybrid models) and otherwise
      ``num_gpu_blocks * block_size``; ``kv_cache_size_source`` says which. Config labels that
      are "None" or not numbers are None: the label set changes between versions.
    * ``created``: the ``_created`` timestamp of each counter and histogram field above that
      has one, keyed by field name; ``process_start_time_seconds`` is absent in multiprocess
      mode (``--api-server-count > 1``). Both let rate computation notice a restart.
    * ``legacy_names``: the pre-rename metric names that were read.
    * ``asleep``: True while the engine sleeps (vLLM's sleep mode), False when it reports itself
      awake, None when the release has no ``vllm:engine_sleep_state`` (before 0.11).
      ``sleep_level`` while asleep: 1 (weights offloaded to host memory, KV cache discarded), 2
      (both discarded) or 0 (scheduling paused; from 0.31 vLLM also reports a released KV cache,
      ``/release_kv_cache_memory``, this way); None when awake or unknown.
    * ``spec_decode_*_total``: speculative-decoding counters, None without
      ``--speculative-config``; ``spec_decode_accepted_per_position_total`` holds one count per
      draft position, 0 first. ``spec_decode_draft_acceptance_rate`` and
      ``spec_decode_efficiency`` are V0's own gauges (fractions since start, None when NaN).
    """

    model_name: str | None
    engine: str | None
    requests_running: int | None = None
    requests_waiting: int | None = None
    kv_cache_usage: float | None = None
    prompt_tokens_total: int | None = None
    generation_tokens_total: int | None = None
    preemptions_total: int | None = None
    prefix_cache_queries_total: int | None = None
    prefix_cache_hits_total: int | None = None
    spec_decode_drafts_total: int | None = None
    spec_decode_draft_tokens_total: int | None = None
    spec_decode_accepted_tokens_total: int | None = None
    spec_decode_accepted_per_position_total: tuple[int, ...] | None = None
    spec_decode_draft_acceptance_rate: float | None = None
    spec_decode_efficiency: float | None = None
    asleep: bool | None = None
    sleep_level: int | None = None
    ttft: Histogram | None = None
    inter_token_latency: Histogram | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_size_source: str | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_max_concurrency: float | None = None
    gpu_memory_utilization: float | None = None
    cache_dtype: str | None = None
    cache_config: Mapping[str, str] = field(default_factory=dict, repr=False)
    process_start_time_seconds: float | None = None
    created: Mapping[str, float] = field(default_factory=dict, repr=False)
    legacy_names: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (histograms via :meth:`Histogram.as_dict`)."""
        result: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, Histogram):
                value = value.as_dict()
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            result[item.name] = value
        return result

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MetricsSnapshot:
        """Inverse of :meth:`as_dict`, so the previous scrape can be kept in the database."""
        known = {item.name for item in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        for name in ("ttft", "inter_token_latency"):
            if values.get(name) is not None:
                values[name] = Histogram.from_dict(values[name])
        for name in ("legacy_names", "spec_decode_accepted_per_position_total"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        return cls(**values)


def parse_metrics_text(text: str) -> MetricsSnapshot:
    """Parse an exposition and return the snapshot of its first engine.

    "First" is the engine whose metrics appear first in the text. vLLM serves one model per
    server; with data parallelism it reports one engine per rank ("0", "1", ...), and an
    aggregating proxy may report several models: use :func:`parse_engines` to get all of them.
    Raises :class:`MetricsParseError` as :func:`parse_engines` does.
    """
    return parse_engines(text)[0]


def parse_engines(text: str) -> tuple[MetricsSnapshot, ...]:
    """Parse an exposition into one snapshot per (model_name, engine), in order of appearance.

    All or nothing: any problem raises :class:`MetricsParseError` and returns nothing. At least
    one snapshot is returned; a text without vLLM engine metrics is an error.
    """
    index = _SampleIndex(_read_samples(text))
    if not index.engines:
        raise MetricsParseError(
            "not a vLLM /metrics endpoint: no vllm:num_requests_running, "
            "vllm:prompt_tokens_total or other engine metrics"
        )
    return tuple(_snapshot(index, key) for key in index.engines)


# --- reading ----------------------------------------------------------------------------------


class _Sample(NamedTuple):
    name: str
    labels: Mapping[str, str]
    value: float


def _read_samples(text: str) -> list[_Sample]:
    if not text.strip():
        raise MetricsParseError("not a vLLM /metrics endpoint: the body is empty")
    if not text.endswith("\n"):
        raise MetricsParseError("not Prometheus text: the last line does not end with a line "
                                "feed (the body was cut off?)")
    try:
        return [_Sample(name, labels, value)
                for name, labels, value in promtext.samples(_used_lines(text), _USED)]
    except ValueError as error:
        raise MetricsParseError(f"not Prometheus text: {_one_line(str(error))}") from None


def _counter_created_name(total_name: str) -> str:
    return total_name.removesuffix("_total") + "_created"


def _wanted_series_names() -> frozenset[str]:
    names: set[str] = set()
    for candidates in _GAUGE_NAMES.values():
        names.update(candidates)
    for candidates in _COUNTER_NAMES.values():
        names.update(candidates)
        names.update(_counter_created_name(name) for name in candidates)
    for candidates in _HISTOGRAM_NAMES.values():
        for base in candidates:
            names.update(f"{base}{suffix}" for suffix in ("_bucket", "_count", "_sum", "_created"))
    names.update((_SLEEP_STATE, _PER_POSITION, _counter_created_name(_PER_POSITION)))
    names.update(_V0_SPEC_GAUGES.values())
    return frozenset(names)


_WANTED = _wanted_series_names()
_USED = _WANTED | {_CACHE_CONFIG, _PROCESS_START}
# Family names as HELP and TYPE comments may write them (a counter with or without "_total").
_USED_FAMILIES = frozenset(
    form
    for name in _USED
    for base in [re.sub(r"(_bucket|_count|_sum|_created|_total)$", "", name)]
    for form in (base, f"{base}_total", name)
)
_SAMPLE_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _alternation(names: Iterable[str]) -> str:
    """A regular expression matching any of ``names``, written as a tree of their common
    prefixes: the regular expression engine tries the branches of an alternation one by one, and
    some 60 names that all start with ``vllm:`` would each be compared from their start."""
    tree: dict[str, dict] = {}
    for name in names:
        node = tree
        for char in name:
            node = node.setdefault(char, {})
        node[""] = {}  # a name ends here

    def written(node: dict[str, dict]) -> str:
        branches = [re.escape(char) + written(child)
                    for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
        return f"(?:{body})?" if "" in node else body

    return written(tree)


_USED_NAME = _alternation(_USED)
_USED_FAMILY = _alternation(_USED_FAMILIES)
# A line that plainly names a family SparkOps does not read, as :func:`_plainly_unused` tells
# it, in the form engines write it (nothing before the name, a single blank in a comment): a
# sample (a name followed by blanks and more, or by ``{...}``) or a HELP or TYPE comment. It
# only ever matches lines :func:`_plainly_unused` drops; any other line is looked at by it.
_UNUSED_LINE = (
    rf"(?!{_USED_NAME}[ \t{{])[a-zA-Z_:][a-zA-Z0-9_:]*(?:[ \t]+\S|\{{[^\n]*\}})[^\n]*"
    rf"|# (?:HELP|TYPE) (?!{_USED_FAMILY}[ \t\n])\S+(?:[ \t][^\n]*)?"
)
# A line that plainly names a family SparkOps reads: :func:`_plainly_unused` keeps it.
_USED_LINE = rf"(?:{_USED_NAME}(?![a-zA-Z0-9_:])|# (?:HELP|TYPE) {_USED_FAMILY}(?=[ \t\n]))"
# A run of unused lines (skipped), then one line: a used one (group 1) or any other (group 2).
_NEXT_LINE = re.compile(rf"(?:(?:{_UNUSED_LINE})\n)*(?:({_USED_LINE}[^\n]*)|([^\n]*))\n")


def _used_lines(text: str) -> str:
    """``text`` without the samples and comments of families SparkOps does not read.

    A line is dropped only when it plainly names such a family (:func:`_plainly_unused`):
    anything else, whatever it is, is kept, so text that is not Prometheus text is still
    refused by the parser, with its reason. The lines engines write are told apart by one
    regular expression, which skips the unused ones in runs; only the rest are looked at one by
    one. Cost: about 0.15 ms of CPU for a vLLM 0.33 scrape of 40 KB, of which a tenth of the
    lines are kept (a loop over every line: 0.28 ms).
    """
    kept = []
    end = 0
    for match in _NEXT_LINE.finditer(text):
        used, other = match.groups()
        if used is not None:
            kept.append(used)
        elif not _plainly_unused(other):
            kept.append(other)
        end = match.end()
    # Every line ending in a line feed was matched, in order; what follows the last one (empty
    # when the text ends with a line feed) is the last line.
    tail = text[end:]
    if not _plainly_unused(tail):
        kept.append(tail)
    return "\n".join(kept)


def _plainly_unused(line: str) -> bool:
    """Whether ``line`` plainly names a family SparkOps does not read: a sample name followed
    by a blank or by a closed ``{...}``, or a HELP or TYPE comment."""
    stripped = line.strip()
    if stripped.startswith("#"):
        parts = stripped.split(None, 3)
        return len(parts) >= 3 and parts[1] in ("HELP", "TYPE") \
            and parts[2] not in _USED_FAMILIES
    name = _SAMPLE_NAME.match(stripped)
    after = stripped[name.end():name.end() + 1] if name is not None else ""
    plain = after in (" ", "\t") or (after == "{" and "}" in stripped)
    return plain and name.group() not in _USED


class _SampleIndex:
    """The samples SparkOps uses, keyed by name and engine; duplicates are rejected."""

    def __init__(self, samples: Iterable[_Sample]) -> None:
        self.engines: list[_EngineKey] = []
        self.cache_configs: list[Mapping[str, str]] = []
        self.process_starts: list[float] = []
        self._series: dict[tuple[str, _EngineKey], dict[str | None, float]] = {}
        seen_engines: set[_EngineKey] = set()
        for sample in samples:
            if sample.name == _CACHE_CONFIG:
                self.cache_configs.append(sample.labels)
            elif sample.name == _PROCESS_START:
                self.process_starts.append(sample.value)
            elif sample.name in _WANTED:
                key = (sample.labels.get("model_name"), sample.labels.get("engine"))
                self._add(sample, key)
                if key not in seen_engines:
                    seen_engines.add(key)
                    self.engines.append(key)

    def _add(self, sample: _Sample, key: _EngineKey) -> None:
        label = "le" if sample.name.endswith("_bucket") else _LABELLED.get(sample.name)
        le = sample.labels.get(label) if label else None
        values = self._series.setdefault((sample.name, key), {})
        if le in values:
            raise MetricsParseError(
                f"invalid vLLM metrics: several {sample.name} series for {_describe(key)}"
            )
        values[le] = sample.value

    def value(self, name: str, key: _EngineKey) -> float | None:
        return self._series.get((name, key), {}).get(None)

    def buckets(self, name: str, key: _EngineKey) -> Mapping[str | None, float]:
        return self._series.get((name, key), {})

    def has(self, name: str, key: _EngineKey) -> bool:
        return (name, key) in self._series


# --- building a snapshot ----------------------------------------------------------------------


def _snapshot(index: _SampleIndex, key: _EngineKey) -> MetricsSnapshot:
    values: dict[str, Any] = {}
    created: dict[str, float] = {}
    legacy: list[str] = []

    for field_name, candidates in _GAUGE_NAMES.items():
        name = _first_present(index, candidates, key, "")
        if name is not None:
            raw = index.value(name, key)
            values[field_name] = (
                _as_fraction(name, raw) if field_name == "kv_cache_usage" else _as_count(name, raw)
            )
            _note_legacy(legacy, name, candidates)

    for field_name, candidates in _COUNTER_NAMES.items():
        name = _first_present(index, candidates, key, "")
        if name is not None:
            values[field_name] = _as_count(name, index.value(name, key))
            _note_created(created, field_name, index.value(_counter_created_name(name), key))
            _note_legacy(legacy, name, candidates)

    for field_name, candidates in _HISTOGRAM_NAMES.items():
        base = _first_present(index, candidates, key, "_bucket")
        if base is not None:
            values[field_name] = _histogram(index, base, key)
            _note_created(created, field_name, index.value(f"{base}_created", key))
            _note_legacy(legacy, base, candidates)

    for field_name, name in _V0_SPEC_GAUGES.items():
        values[field_name] = _as_rate(name, index.value(name, key))
    per_position = index.buckets(_PER_POSITION, key)
    if per_position:
        values["spec_decode_accepted_per_position_total"] = _per_position(per_position, key)
        first = index.buckets(_counter_created_name(_PER_POSITION), key).get("0")
        _note_created(created, "spec_decode_accepted_per_position_total", first)
    sleep = index.buckets(_SLEEP_STATE, key)
    if sleep:
        values["asleep"], values["sleep_level"] = _sleep_state(sleep, key)

    cache_config = _cache_config_for(index, key)
    return MetricsSnapshot(
        model_name=key[0],
        engine=key[1],
        **values,
        **_capacity(cache_config or {}),
        cache_config=dict(cache_config or {}),
        process_start_time_seconds=_process_start(index),
        created=created,
        legacy_names=tuple(legacy),
    )


def _first_present(
    index: _SampleIndex, candidates: tuple[str, ...], key: _EngineKey, suffix: str
) -> str | None:
    for name in candidates:
        if index.has(f"{name}{suffix}", key):
            return name
    return None


def _note_legacy(legacy: list[str], name: str, candidates: tuple[str, ...]) -> None:
    if name != candidates[0]:
        legacy.append(name)


def _note_created(created: dict[str, float], field_name: str, value: float | None) -> None:
    if value is not None and math.isfinite(value):
        created[field_name] = value


def _as_count(name: str, value: float | None) -> int | None:
    return None if value is None else _require_count(name, value)


def _require_count(name: str, value: float) -> int:
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise MetricsParseError(f"invalid vLLM metrics: {name} is {value!r}, not a count")
    return int(value)


def _as_fraction(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or not -_KV_USAGE_SLACK <= value <= 1 + _KV_USAGE_SLACK:
        raise MetricsParseError(
            f"invalid vLLM metrics: {name} is {value!r}, not a fraction between 0 and 1"
        )
    return min(max(value, 0.0), 1.0)


def _as_rate(name: str, value: float | None) -> float | None:
    """A V0 gauge that is a fraction since start: None when absent or NaN (no draft yet)."""
    if value is None or math.isnan(value):
        return None
    if not 0 <= value <= 1 + _KV_USAGE_SLACK:
        raise MetricsParseError(f"invalid vLLM metrics: {name} is {value!r}, not a fraction")
    return min(value, 1.0)


def _per_position(series: Mapping[str | None, float], key: _EngineKey) -> tuple[int, ...]:
    """Accepted tokens per draft position, position 0 first; vLLM creates one series for each
    of the ``num_speculative_tokens`` positions at start, so they run 0..k-1 without a gap."""
    where = f"{_PER_POSITION} for {_describe(key)}"
    positions = sorted(int(p) if p is not None and p.isdecimal() else -1 for p in series)
    if positions != list(range(len(positions))):
        raise MetricsParseError(f"invalid vLLM metrics: {where} has positions "
                                f"{sorted(map(str, series))}, not 0..k-1")
    return tuple(_require_count(_PER_POSITION, series[str(p)]) for p in positions)


def _sleep_state(series: Mapping[str | None, float], key: _EngineKey
                 ) -> tuple[bool | None, int | None]:
    """``(asleep, level)`` from vLLM's ``record_sleep_state`` (vllm/v1/metrics/loggers.py:1335 of
    0.33): awake=1 while awake; asleep, awake=0 with weights_offloaded=1 at level 1,
    discard_all=1 at level 2, neither at level 0 (and for a released KV cache, 0.31-0.33)."""
    where = f"{_SLEEP_STATE} for {_describe(key)}"
    flags: dict[str, bool] = {}
    for state, value in series.items():
        if value not in (0.0, 1.0):
            raise MetricsParseError(f"invalid vLLM metrics: {where} {_SLEEP_LABEL}={state!r} "
                                    f"is {value!r}, not 0 or 1")
        flags[str(state)] = value == 1.0
    offloaded, discarded = flags.get("weights_offloaded"), flags.get("discard_all")
    if offloaded and discarded:
        raise MetricsParseError(f"invalid vLLM metrics: {where} says both sleep levels at once")
    level = 1 if offloaded else 2 if discarded else None
    awake = flags.get("awake")
    if awake and level is not None:
        raise MetricsParseError(f"invalid vLLM metrics: {where} says awake and asleep at once")
    if awake is None:
        return (True, level) if level is not None else (None, None)
    if awake:
        return False, None
    return True, 0 if level is None else level


def _histogram(index: _SampleIndex, base: str, key: _EngineKey) -> Histogram:
    """Build and check one histogram; a broken one means the body cannot be trusted."""
    where = f"{base} for {_describe(key)}"
    bounds: list[tuple[float, int]] = []
    for le, raw in index.buckets(f"{base}_bucket", key).items():
        bound = _parse_bound(le)
        if bound is None:
            raise MetricsParseError(f"invalid vLLM metrics: {where} has a bucket le={le!r}")
        bounds.append((bound, _require_count(f"{base}_bucket", raw)))
    bounds.sort()
    if bounds[-1][0] != math.inf:
        raise MetricsParseError(f"invalid vLLM metrics: {where} has no +Inf bucket (cut off?)")
    counts = [count for _bound, count in bounds]
    if any(later < earlier for earlier, later in pairwise(counts)):
        raise MetricsParseError(f"invalid vLLM metrics: {where} buckets are not cumulative")
    total = _as_count(f"{base}_count", index.value(f"{base}_count", key))
    if total is not None and total != counts[-1]:
        raise MetricsParseError(
            f"invalid vLLM metrics: {where} has _count {total} but +Inf bucket {counts[-1]}"
        )
    observed = index.value(f"{base}_sum", key)
    if observed is not None and not math.isfinite(observed):
        raise MetricsParseError(f"invalid vLLM metrics: {where} has _sum {observed!r}")
    return Histogram(buckets=tuple(bounds), count=counts[-1], sum=observed)


def _parse_bound(le: str | None) -> float | None:
    if le is None:
        return None
    try:
        bound = float(le)
    except ValueError:
        return None
    return None if math.isnan(bound) else bound


def _cache_config_for(index: _SampleIndex, key: _EngineKey) -> Mapping[str, str] | None:
    """The engine's ``vllm:cache_config_info`` labels, or None when absent or ambiguous."""
    matches = [labels for labels in index.cache_configs if labels.get("engine") == key[1]]
    if len(matches) == 1:
        return matches[0]
    if not matches and len(index.cache_configs) == 1:
        # Older versions have no engine label on it, or the metric and engines disagree on
        # it; one config on a server that runs one model can only be that model's.
        return index.cache_configs[0]
    return None


def _capacity(labels: Mapping[str, str]) -> dict[str, Any]:
    blocks = _label_int(labels, "num_gpu_blocks")
    block_size = _label_int(labels, "block_size")
    size_tokens = _label_int(labels, "kv_cache_size_tokens")
    source = "kv_cache_size_tokens" if size_tokens is not None else None
    # Before PR #42206 the label did not exist and blocks x block size was the capacity; for
    # hybrid models (Mamba, sliding window) that product is wrong, so it is only a fallback.
    if "kv_cache_size_tokens" not in labels and blocks is not None and block_size is not None:
        size_tokens = blocks * block_size
        source = "num_gpu_blocks*block_size"
    cache_dtype = labels.get("cache_dtype")
    return {
        "kv_cache_size_tokens": size_tokens,
        "kv_cache_size_source": source,
        "num_gpu_blocks": blocks,
        "block_size": block_size,
        "kv_cache_memory_bytes": _label_int(labels, "kv_cache_memory_bytes"),
        "kv_cache_max_concurrency": _label_float(labels, "kv_cache_max_concurrency"),
        "gpu_memory_utilization": _label_float(labels, "gpu_memory_utilization"),
        "cache_dtype": None if cache_dtype in (None, "", "None") else cache_dtype,
    }


def _label_float(labels: Mapping[str, str], name: str) -> float | None:
    try:
        value = float(labels.get(name, ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _label_int(labels: Mapping[str, str], name: str) -> int | None:
    text = labels.get(name, "")
    if text.isdecimal():
        return int(text)  # exact, also beyond the 2**53 a float holds
    value = _label_float(labels, name)
    return int(value) if value is not None and value.is_integer() else None


def _process_start(index: _SampleIndex) -> float | None:
    if len(index.process_starts) != 1:
        return None
    value = index.process_starts[0]
    return value if math.isfinite(value) and value > 0 else None


# --- formatting -------------------------------------------------------------------------------


def _describe(key: _EngineKey) -> str:
    model, engine = key
    return f"model {model!r} engine {engine!r}"


def _format_bound(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(bound)


def _one_line(text: str) -> str:
    cleaned = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return cleaned if len(cleaned) <= _REASON_LIMIT else cleaned[: _REASON_LIMIT - 1] + "…"
