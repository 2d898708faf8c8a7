"""The figures SparkOps exports, read once and shared by ``/metrics`` and the JSON API.

Plain functions over the collectors' rows, in base units (bytes, seconds, ratios 0–1), so both
exports say the same thing. Every unknown figure is None, with a reason where one is known;
callers omit it (``/metrics``) or show null (the API), never 0.

What counts as *current*:

* Host memory comes from the latest collection only (``collectors.hostmemory``), and only when
  it succeeded and is not stale (``collectors.sampling.stale_after``: the worker or beat is not
  running). A failed or stale collection makes the figures unknown; the collection's age is
  always known. Where the node's engines run in a memory budget, the headroom is the smaller of
  the host's and the budget's room, as in the ledger (``collectors.ledger.Ledger.headroom``).
* An engine's serving figures (requests, KV usage, rates, latency quantiles) come from its last
  scrape only while its container runs and that scrape succeeded; the rates of an interval in
  which the engine restarted are None (``collectors.vllm.rates``), never 0 or negative.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from collectors.hostmemory import latest_collection
from collectors.models import Engine, Metric, Node
from collectors.redaction import mask_text

__all__ = [
    "ENGINE_PHASES",
    "HOST_FIGURES",
    "SERVING_FIGURES",
    "HostFigure",
    "HostReading",
    "age_seconds",
    "engine_model",
    "host_reading",
    "scrape_up",
    "serving_figures",
]


@dataclass(frozen=True)
class HostFigure:
    """One host-memory figure: its export key (unit-suffixed), the sampled metric, and the factor
    from the stored unit to the base unit (PSI is stored in percent, exported as a ratio)."""

    key: str
    metric: Metric
    scale: float = 1.0

    @property
    def is_bytes(self) -> bool:
        return self.key.endswith("_bytes")


HOST_FIGURES: tuple[HostFigure, ...] = (
    HostFigure("mem_available_bytes", Metric.MEM_AVAILABLE),
    HostFigure("mem_available_interval_min_bytes", Metric.MEM_AVAILABLE_MIN),
    HostFigure("mem_free_bytes", Metric.MEM_FREE),
    HostFigure("page_cache_reclaimable_bytes", Metric.PAGE_CACHE_RECLAIMABLE),
    HostFigure("swap_used_bytes", Metric.SWAP_USED),
    HostFigure("psi_some_avg10_ratio", Metric.PSI_SOME_AVG10, 0.01),
    HostFigure("psi_full_avg10_ratio", Metric.PSI_FULL_AVG10, 0.01),
)
# The memory budget's room, its interval minimum first (the ledger's rule); it bounds the
# headroom where it is smaller.
_BUDGET_ROOM = (Metric.MEMORY_BUDGET_ROOM_MIN, Metric.MEMORY_BUDGET_ROOM)

# Every phase an engine row can hold: the startup log's phases (collectors.vllm.logs.PHASES),
# "starting" / "stopped" for a container without a recognisable log or not running, and "gone"
# for a vanished container (collectors.engines).
ENGINE_PHASES: tuple[str, ...] = (
    "unknown", "starting", "loading", "profiling", "kv_allocated", "ready", "failed", "stopped",
    "gone",
)

# Serving figures: export key -> (where it is read, the field there). Requests and KV usage are
# gauges of the last scrape; the rest are rates and quantiles over the last scrape interval.
SERVING_FIGURES: dict[str, tuple[str, str]] = {
    "requests_running": ("snapshot", "requests_running"),
    "requests_waiting": ("snapshot", "requests_waiting"),
    "kv_cache_usage_ratio": ("snapshot", "kv_cache_usage"),
    "prefill_tokens_per_second": ("rates", "prefill_tokens_per_s"),
    "decode_tokens_per_second": ("rates", "decode_tokens_per_s"),
    "ttft_p50_seconds": ("rates", "ttft_p50_s"),
    "ttft_p95_seconds": ("rates", "ttft_p95_s"),
    "itl_p50_seconds": ("rates", "itl_p50_s"),
    "itl_p95_seconds": ("rates", "itl_p95_s"),
}


@dataclass
class HostReading:
    """A node's current host-memory figures (see the module docstring for "current").

    ``values`` maps every :data:`HOST_FIGURES` key to its value in base units (bytes as int) or
    None; ``unknown_reasons`` says why for each None. ``collection_ok`` is None before the first
    collection.
    """

    collected_at: datetime | None
    age_seconds: float | None
    collection_ok: bool | None
    error: str
    stale: bool
    values: dict[str, float | int | None] = field(default_factory=dict)
    unknown_reasons: dict[str, str] = field(default_factory=dict)
    # The memory budget's room (its interval minimum first); None without a budget, for an
    # unlimited one and when unknown.
    budget_room_bytes: int | None = None

    @property
    def headroom_bytes(self) -> int | None:
        """Room for a transient buffer: the interval's lowest MemAvailable, else MemAvailable,
        or the memory budget's room when that is smaller (the ledger's definition,
        ``collectors.ledger.Ledger.headroom``)."""
        lowest = self.values.get("mem_available_interval_min_bytes")
        value = lowest if lowest is not None else self.values.get("mem_available_bytes")
        known = [int(v) for v in (value, self.budget_room_bytes) if v is not None]
        return min(known) if known else None


def host_reading(node: Node, now: datetime, interval: float) -> HostReading:
    """Read ``node``'s current host figures. Cost: two indexed queries (the latest collection,
    then its window's samples: ``collectors.hostmemory.latest_collection``)."""
    latest = latest_collection(node, now, interval, [figure.metric for figure in HOST_FIGURES]
                               + list(_BUDGET_ROOM))
    if latest.collection is None:
        return _unknown(HostReading(None, None, None, "", True), "no collection yet")
    age = max(latest.age_seconds or 0.0, 0.0)
    reading = HostReading(latest.collection.at, age, latest.ok, latest.error, latest.stale)
    if not latest.ok:
        return _unknown(reading, f"the latest collection failed: {latest.collection.error}")
    if reading.stale:
        return _unknown(reading, f"no collection for {age:.0f} s (is the worker or beat "
                                 "running?)")
    for figure in HOST_FIGURES:
        sample = latest.samples.get(figure.metric)
        if sample is None or sample.value is None:
            reading.values[figure.key] = None
            reading.unknown_reasons[figure.key] = (
                sample.note if sample is not None and sample.note
                else "not reported by the latest collection"
            )
            continue
        value = sample.value * figure.scale
        reading.values[figure.key] = round(value) if figure.is_bytes else value
    rooms = [latest.samples.get(metric) for metric in _BUDGET_ROOM]
    reading.budget_room_bytes = next((round(room.value) for room in rooms
                                      if room is not None and room.value is not None), None)
    return reading



def _unknown(reading: HostReading, reason: str) -> HostReading:
    for figure in HOST_FIGURES:
        reading.values[figure.key] = None
        reading.unknown_reasons[figure.key] = reason
    return reading


def age_seconds(at: str | None, now: datetime) -> float | None:
    """Seconds from an ISO 8601 instant (as the ledger stores it) to ``now``; None when the
    instant is missing or unreadable."""
    if not at:
        return None
    try:
        return max((now - datetime.fromisoformat(at)).total_seconds(), 0.0)
    except (TypeError, ValueError):
        return None


def engine_model(engine: Engine) -> str | None:
    """The model an engine serves, in the overview card's order of preference: the served name,
    the launch flag, then what its /metrics labels said; a credential in it (a model URL's
    password) masked."""
    config = engine.config or {}
    snapshot = (engine.metrics or {}).get("snapshot") or {}
    for candidate in (config.get("served_model_name"), config.get("model"),
                      snapshot.get("model_name")):
        if candidate:
            return mask_text(str(candidate))
    return None


def scrape_up(engine: Engine) -> bool | None:
    """Whether the engine answers ``/metrics`` now: its container runs and the latest scrape
    succeeded. None when SparkOps never tried to scrape it."""
    if engine.last_scrape_at is None:
        return None
    return (engine.container_state == "running" and not engine.last_scrape_error
            and engine.last_scrape_ok_at is not None)


def serving_figures(engine: Engine) -> dict[str, float | None]:
    """Every :data:`SERVING_FIGURES` key with its current value, or None when unknown (never
    scraped, not answering now, or not reported)."""
    if not scrape_up(engine):
        return dict.fromkeys(SERVING_FIGURES)
    sources = {"snapshot": (engine.metrics or {}).get("snapshot") or {},
               "rates": engine.rates or {}}
    figures: dict[str, float | None] = {}
    for key, (source, name) in SERVING_FIGURES.items():
        value = sources[source].get(name)
        figures[key] = float(value) if isinstance(value, int | float) \
            and not isinstance(value, bool) else None
    return figures
