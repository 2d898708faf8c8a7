"""SparkOps' own figures at ``GET /metrics``, in the Prometheus text format (version 0.0.4).

Every family is a gauge named ``sparkops_…`` in base units (bytes, seconds, ratios 0–1). A figure
SparkOps does not know right now is **omitted** (Prometheus' "no data"), never exported as 0;
see ``dashboard.exports.figures`` for what counts as current. Counts (alerts by state,
restarts) are known and exported with their zeros.

Node series (label ``node``):

* ``sparkops_mem_total_bytes`` — MemTotal as last read from the node.
* ``sparkops_mem_available_bytes``, ``sparkops_mem_available_interval_min_bytes`` (lowest
  MemAvailable within the latest collection interval), ``sparkops_mem_free_bytes``,
  ``sparkops_page_cache_reclaimable_bytes``, ``sparkops_swap_used_bytes``,
  ``sparkops_psi_some_avg10_ratio``, ``sparkops_psi_full_avg10_ratio`` (memory PSI as 0–1),
  ``sparkops_headroom_bytes`` (interval minimum, else MemAvailable; the engines' memory budget's
  room where that is smaller) — latest collection only.
* ``sparkops_collection_age_seconds`` (since the latest collection attempt) and
  ``sparkops_collection_ok`` (1 when that attempt read the node's memory, else 0).
* ``sparkops_ledger_age_seconds`` and ``sparkops_ledger_others_bytes`` (every process that is
  not an engine) from the node's memory ledger.
* ``sparkops_alerts{node,state}`` — alert rows per state (pending, firing, resolved).

Engine series (labels ``node``, ``engine``, ``model``; ``model`` is empty when unknown):

* ``sparkops_engine_info{…,image,version,kind} 1``.
* ``sparkops_engine_phase{…,phase}`` — one series per phase, 1 for the current one, else 0.
* ``sparkops_ledger_weights_bytes``, ``sparkops_ledger_kv_pool_bytes``,
  ``sparkops_ledger_cuda_graphs_bytes``, ``sparkops_ledger_reserved_bytes`` (their sum),
  ``sparkops_ledger_prefill_need_bytes{…,source}`` (``source`` is ``observed`` or
  ``estimate``).
* ``sparkops_engine_scrape_up`` — 1 when the engine runs and its latest ``/metrics`` scrape
  succeeded, else 0; absent for an engine never scraped.
* ``sparkops_engine_max_num_seqs`` (its launch flag).
* Only while the engine answers: ``sparkops_engine_requests_running``,
  ``sparkops_engine_requests_waiting``, ``sparkops_engine_kv_cache_usage_ratio``,
  ``sparkops_engine_prefill_tokens_per_second``, ``sparkops_engine_decode_tokens_per_second``,
  ``sparkops_engine_ttft_p50_seconds``, ``sparkops_engine_ttft_p95_seconds``,
  ``sparkops_engine_itl_p50_seconds``, ``sparkops_engine_itl_p95_seconds`` (rates and
  inter-token/first-token latency quantiles over the latest scrape interval).

History series (no ``model``: it may have changed since):

* ``sparkops_alert_firing{rule,node,engine,severity} 1`` — one per firing alert (``engine``
  empty for node-wide rules).
* ``sparkops_engine_restarts{node,engine,kind,status}`` — restart-ledger rows for each present
  engine and each engine with a restart on record; every status a kind takes is listed (planned:
  scheduled … cancelled; unplanned: detected), 0 when there is none.

Every scrape reads the database afresh (a handful of indexed queries per node); nothing is
cached between scrapes, so two scrapes a second apart may differ only by what was collected.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from collectors.models import Engine, Node
from dashboard.alerting.models import Alert, AlertState
from dashboard.exports.access import export_view
from dashboard.exports.figures import (
    ENGINE_PHASES,
    HOST_FIGURES,
    SERVING_FIGURES,
    age_seconds,
    engine_model,
    host_reading,
    scrape_up,
    serving_figures,
)
from dashboard.restarts.models import Restart

# prometheus_client is imported where a scrape uses it: the web server loads this module with
# its URLs, and most installations are never scraped.
if TYPE_CHECKING:
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.metrics_core import Metric

__all__ = ["CONTENT_TYPE", "SparkOpsCollector", "metrics", "render_metrics"]

PREFIX = "sparkops_"
# The classic text format, which every Prometheus (2.x and 3.x) and promtool read; all our names
# are valid in it, so nothing is lost by not negotiating a newer one.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NODE = ("node",)
ENGINE = ("node", "engine", "model")

_HOST_HELP = {
    "mem_available_bytes": "MemAvailable at the latest collection: what the kernel can hand "
                           "out, counting reclaimable page cache.",
    "mem_available_interval_min_bytes": "Lowest MemAvailable seen within the latest collection "
                                        "interval (catches transient prefill buffers).",
    "mem_free_bytes": "MemFree at the latest collection: truly unused memory (what CUDA reports "
                      "as free on GB10).",
    "page_cache_reclaimable_bytes": "Reclaimable page cache (Cached - Shmem + Buffers + "
                                    "SReclaimable) at the latest collection.",
    "swap_used_bytes": "Swap in use (SwapTotal - SwapFree) at the latest collection.",
    "psi_some_avg10_ratio": "Memory pressure: share of the last 10 s in which some task stalled "
                            "on memory (PSI some avg10, 0-1).",
    "psi_full_avg10_ratio": "Memory pressure: share of the last 10 s in which all tasks stalled "
                            "on memory (PSI full avg10, 0-1).",
}
_LEDGER_PARTS = {
    "weights": "Model weights an engine holds, from its startup log.",
    "kv_pool": "KV-cache pool an engine holds (its report, startup log or pinned flag).",
    "cuda_graphs": "CUDA-graph memory an engine holds, from its startup log.",
    "reserved": "Weights + KV pool + CUDA graphs of an engine (absent when any part is "
                "unknown).",
}
# Serving figures (``figures.SERVING_FIGURES`` keys), each exported as ``sparkops_engine_<key>``.
# Latency quantiles are separate gauges, not a ``quantile`` label: that label belongs to summaries
# (promtool rejects it on a gauge), and these are quantiles SparkOps computed per interval.
_SERVING_HELP = {
    "requests_running": "Requests the engine is running now.",
    "requests_waiting": "Requests waiting for a slot (vLLM 0.33 counts deferred ones too).",
    "kv_cache_usage_ratio": "Share of the engine's KV-cache blocks in use (0-1).",
    "prefill_tokens_per_second": "Prompt tokens processed per second over the latest scrape "
                                 "interval (prefix-cache hits included).",
    "decode_tokens_per_second": "Tokens generated per second over the latest scrape interval.",
    "ttft_p50_seconds": "Median time to first token over the latest scrape interval.",
    "ttft_p95_seconds": "95th-percentile time to first token over the latest scrape interval.",
    "itl_p50_seconds": "Median inter-token latency over the latest scrape interval.",
    "itl_p95_seconds": "95th-percentile inter-token latency over the latest scrape interval.",
}
# The statuses each kind of restart takes (dashboard.restarts.models.Restart): zero-filled, so a
# first failure shows as a step from 0 rather than a series appearing from nothing.
_RESTART_STATUSES: dict[str, list[str]] = {
    Restart.Kind.PLANNED.value: [s for s in Restart.Status.values
                                 if s != Restart.Status.DETECTED.value],
    Restart.Kind.UNPLANNED.value: [Restart.Status.DETECTED.value],
}


def _gauge(name: str, documentation: str, labels: Sequence[str]) -> GaugeMetricFamily:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(PREFIX + name, documentation, labels=list(labels))


def _put(family: Metric, labels: Sequence[str], value: float | int | bool | None) -> None:
    """Add one sample unless the value is unknown: an absent series is Prometheus' "unknown"."""
    if value is not None:
        family.add_metric(list(labels), float(value))


class SparkOpsCollector:
    """A prometheus_client custom collector over the database, for one scrape at ``now``.

    Register it with a fresh :class:`CollectorRegistry` per scrape; :meth:`collect` yields only
    families that have at least one sample.
    """

    def __init__(self, now: datetime, interval: float) -> None:
        self.now = now
        self.interval = interval

    def collect(self) -> Iterator[Metric]:
        nodes = list(Node.objects.order_by("name"))
        engines = list(Engine.objects.filter(present=True).select_related("node")
                       .order_by("node__name", "name"))
        families: list[Metric] = [
            *self._host(nodes),
            *self._ledger(nodes),
            *self._engines(engines),
            *self._alerts(nodes),
            self._restarts(engines),
        ]
        yield from (family for family in families if family.samples)

    def _host(self, nodes: Iterable[Node]) -> list[Metric]:
        total = _gauge("mem_total_bytes", "MemTotal of the node, as last read from it.", NODE)
        figures = {f.key: _gauge(f.key, _HOST_HELP[f.key], NODE) for f in HOST_FIGURES}
        headroom = _gauge("headroom_bytes", "Room left for a transient buffer: the lowest "
                          "MemAvailable of the latest interval, else MemAvailable, or the "
                          "engines' memory budget's room when that is smaller.", NODE)
        age = _gauge("collection_age_seconds", "Seconds since the latest host-memory collection "
                     "attempt.", NODE)
        ok = _gauge("collection_ok", "1 when the latest host-memory collection read the node's "
                    "memory, 0 when it failed.", NODE)
        for node in nodes:
            reading = host_reading(node, self.now, self.interval)
            _put(total, [node.name], node.mem_total_bytes)
            for key, family in figures.items():
                _put(family, [node.name], reading.values[key])
            _put(headroom, [node.name], reading.headroom_bytes)
            _put(age, [node.name], reading.age_seconds)
            _put(ok, [node.name], reading.collection_ok)
        return [total, *figures.values(), headroom, age, ok]

    def _ledger(self, nodes: Sequence[Node]) -> list[Metric]:
        parts = {part: _gauge(f"ledger_{part}_bytes", help_text, ENGINE)
                 for part, help_text in _LEDGER_PARTS.items()}
        need = _gauge("ledger_prefill_need_bytes", "Transient memory an engine's prefill needs: "
                      "the largest dip observed while it alone prefilled, or the estimate "
                      "(max-num-batched-tokens x activation bytes per token).",
                      [*ENGINE, "source"])
        others = _gauge("ledger_others_bytes", "Resident memory of every process that is not an "
                        "engine, from the node's memory ledger.", NODE)
        age = _gauge("ledger_age_seconds", "Seconds since the node's memory ledger was built.",
                     NODE)
        engine_ids = [share.get("engine_id") for node in nodes
                      for share in (node.ledger or {}).get("engines", [])]
        models = {e.pk: engine_model(e) or "" for e in Engine.objects.filter(pk__in=engine_ids)}
        for node in nodes:
            ledger = node.ledger or {}
            if not ledger:
                continue
            _put(others, [node.name], ledger.get("others_total"))
            _put(age, [node.name], age_seconds(ledger.get("at"), self.now))
            for share in ledger.get("engines", []):
                labels = [node.name, str(share.get("name", "")),
                          models.get(share.get("engine_id"), "")]
                for part, family in parts.items():
                    _put(family, labels, share.get(part))
                _put(need, [*labels, share.get("prefill_need_source") or ""],
                     share.get("prefill_need"))
        return [*parts.values(), need, others, age]

    def _engines(self, engines: Iterable[Engine]) -> list[Metric]:
        from prometheus_client.core import InfoMetricFamily

        info = InfoMetricFamily(PREFIX + "engine", "The engine's container image, vLLM version "
                                "and kind.", labels=list(ENGINE))
        phase = _gauge("engine_phase", "1 for the engine's current phase, 0 for the others.",
                       [*ENGINE, "phase"])
        up = _gauge("engine_scrape_up", "1 when the engine runs and its latest /metrics scrape "
                    "succeeded, else 0.", ENGINE)
        slots = _gauge("engine_max_num_seqs", "Request slots of the engine (--max-num-seqs).",
                       ENGINE)
        serving = {key: _gauge(f"engine_{key}", _SERVING_HELP[key], ENGINE)
                   for key in SERVING_FIGURES}
        for engine in engines:
            labels = [engine.node.name, engine.name, engine_model(engine) or ""]
            info.add_metric(labels, {
                "image": engine.image,
                "version": str((engine.startup or {}).get("version") or ""),
                "kind": engine.kind,
            })
            phases = ENGINE_PHASES if engine.phase in ENGINE_PHASES \
                else (*ENGINE_PHASES, engine.phase)
            for name in phases:
                _put(phase, [*labels, name], name == engine.phase)
            _put(up, labels, scrape_up(engine))
            _put(slots, labels, (engine.config or {}).get("max_num_seqs"))
            figures = serving_figures(engine)
            for key, family in serving.items():
                _put(family, labels, figures[key])
        return [info, phase, up, slots, *serving.values()]

    def _alerts(self, nodes: Iterable[Node]) -> list[Metric]:
        firing = _gauge("alert_firing", "1 for each firing alert, by rule, node, engine and "
                        "severity.", ["rule", "node", "engine", "severity"])
        rows = Alert.objects.filter(state=AlertState.FIRING).select_related("node", "engine") \
            .order_by("node__name", "rule", "scope")
        seen: set[tuple[str, ...]] = set()
        for alert in rows:
            labels = (alert.rule, alert.node.name,
                      alert.engine.name if alert.engine is not None else "", alert.severity)
            # Two firing alerts can share a label set (their engine rows deleted); a duplicate
            # series would make Prometheus reject the whole scrape.
            if labels not in seen:
                seen.add(labels)
                _put(firing, labels, 1)
        counts = _gauge("alerts", "Alerts of the node in each state.", ["node", "state"])
        by_state = {(row["node_id"], row["state"]): row["n"]
                    for row in Alert.objects.values("node_id", "state").annotate(n=Count("id"))}
        for node in nodes:
            for state in AlertState.values:
                _put(counts, [node.name, state], by_state.get((node.pk, state), 0))
        return [firing, counts]

    def _restarts(self, engines: Iterable[Engine]) -> Metric:
        family = _gauge("engine_restarts", "Restarts in the restart ledger, by kind and status.",
                        ["node", "engine", "kind", "status"])
        counted = {(row["engine_id"], row["kind"], row["status"]): row["n"]
                   for row in Restart.objects.values("engine_id", "kind", "status")
                   .annotate(n=Count("id"))}
        listed = {engine.pk: engine for engine in engines}
        missing = {engine_id for engine_id, _, _ in counted} - set(listed)
        listed.update((e.pk, e) for e in Engine.objects.filter(pk__in=missing)
                      .select_related("node"))
        for engine in sorted(listed.values(), key=lambda e: (e.node.name, e.name)):
            combinations = [(kind, status) for kind, statuses in _RESTART_STATUSES.items()
                            for status in statuses]
            # A combination outside the table above is still shown, never hidden.
            combinations += sorted((kind, status) for engine_id, kind, status in counted
                                   if engine_id == engine.pk
                                   and (kind, status) not in combinations)
            for kind, status in combinations:
                _put(family, [engine.node.name, engine.name, kind, status],
                     counted.get((engine.pk, kind, status), 0))
        return family


def render_metrics(now: datetime, interval: float) -> bytes:
    """The exposition text for one scrape at ``now``."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SparkOpsCollector(now, interval))
    return generate_latest(registry)


@export_view
def metrics(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: the exposition above, for Prometheus (token or allowlist, see access)."""
    body = render_metrics(timezone.now(), settings.SPARKOPS_COLLECT_INTERVAL)
    return HttpResponse(body, content_type=CONTENT_TYPE)
