"""The overview's one timeline: the node's story on a single time axis.

Panels, top to bottom (all share one x axis on the page):

* ``markers`` — what happened: restarts (planned and unplanned), alerts (fired, resolved), engine
  phase changes, prefill stalls and exits, each with a hover text.
* ``headroom`` — MemAvailable with its interval minima, MemFree, reclaimable page cache and swap
  in use (GiB), with memory pressure (PSI, %) on a second axis.
* ``ledger`` — the memory ledger over time: what each engine holds, its KV pool, and other
  processes whose size moved.
* ``kv`` — KV-cache usage per engine (%).
* ``prefill`` and ``decode`` — tok/s per engine.
* ``gpu_utilization_gpu_pct``, ``gpu_temperature_c``, ``gpu_power_w``, ``gpu_sm_clock_mhz`` —
  NVML's figures per GPU (``dashboard.gpuseries``), only on a node with a GPU in range or in
  its latest report; each carries the words it shows when it has no line (``empty``).

**Exact and stepwise.** Host series, what an engine holds (NVML per-process memory, else its
cgroup), KV usage and tok/s are *exact*: the values measured at each collection (per-minute or
per-hour min and max over long ranges), reduced with the min-max downsampler so no dip is lost.
KV pools and other processes are *stepwise*: SparkOps keeps only :class:`LedgerChange` rows,
written when a component moves by at least the change threshold (0.5 % of MemTotal by default).
Between two rows the size is the earlier row's ``after``; moves smaller than the threshold do not
show. A step line is drawn only where SparkOps was collecting (the stretches of the host series
without a gap): it starts at the first collection in range with the ``after`` of the last earlier
row (else, in the first row's stretch, that row's ``before``, except an engine's first
appearance, ``0 → size``, which starts it), and it breaks (a None) across every stretch without
collections.

Unknown is ``None`` (a gap), never 0. Every series has at most ``max_points`` points, its
times (``x``) in milliseconds since the epoch (``dashboard.downsample``), which the page draws
on a date axis in the viewer's zone (``static/js/clock.js``).
Cost: one query per source for all host series and one for all engine series, each one index
range of the tier that suits the range (``dashboard.series``; over a long range, the buckets
that settled since the last request in one more, the others kept, ``dashboard.settled``); one
query for the ledger's change rows in range and one for the size each component had before it;
a few small ones (engines, failures, markers).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections
from django.db.models import Q

from collectors.models import (
    Collection,
    Engine,
    EngineMetric,
    Event,
    LedgerChange,
    Metric,
    Node,
)
from dashboard.alerting.models import Alert
from dashboard.downsample import SeriesPoint, epoch_ms
from dashboard.gpuseries import gpu_history
from dashboard.memory import RANGES, collection_failures, gap_step_seconds, reduce_series
from dashboard.restarts.models import Restart
from dashboard.series import (
    EpochMillis,
    chart_bucket_seconds,
    engine_points,
    host_points,
    resolution_for,
    source_label,
)
from sparkops.units import GIB

Points = list[tuple[int, float | None]]  # (epoch milliseconds, value or None for a gap)

PANELS = [
    {"key": "markers", "title": "Restarts, alerts and engine events", "unit": ""},
    {"key": "headroom", "title": "Headroom", "unit": "GiB"},
    {"key": "ledger", "title": "Memory ledger: what engines and processes hold", "unit": "GiB"},
    {"key": "kv", "title": "KV-cache usage", "unit": "%"},
    {"key": "prefill", "title": "Prefill", "unit": "tok/s"},
    {"key": "decode", "title": "Decode", "unit": "tok/s"},
]


@dataclass(frozen=True)
class HostSeries:
    key: str
    metric: Metric
    label: str
    unit: str  # "GiB" or "%"


HOST_SERIES = [
    HostSeries("mem_available", Metric.MEM_AVAILABLE, "MemAvailable", "GiB"),
    HostSeries("mem_available_min", Metric.MEM_AVAILABLE_MIN,
               "MemAvailable, lowest in each interval", "GiB"),
    HostSeries("mem_free", Metric.MEM_FREE, "MemFree (≈ CUDA free)", "GiB"),
    HostSeries("page_cache_reclaimable", Metric.PAGE_CACHE_RECLAIMABLE,
               "Reclaimable page cache", "GiB"),
    HostSeries("swap_used", Metric.SWAP_USED, "Swap in use", "GiB"),
    HostSeries("psi_some_avg10", Metric.PSI_SOME_AVG10, "Memory pressure (PSI some avg10)", "%"),
    # Fragmentation (collectors.fragmentation): MemAvailable can look fine while no large
    # block is left.
    HostSeries("free_in_huge_blocks", Metric.FREE_IN_HUGE_BLOCKS,
               "Free in huge-page-sized blocks", "GiB"),
]

# Engine series: (panel, key suffix, metric, label, scale to the panel's unit).
ENGINE_SERIES = [
    ("kv", "kv_usage", EngineMetric.KV_CACHE_USAGE, "KV-cache usage", 100.0),
    ("prefill", "prefill_tps", EngineMetric.PREFILL_TPS, "prefill tok/s", 1.0),
    ("decode", "decode_tps", EngineMetric.DECODE_TPS, "decode tok/s", 1.0),
]

# What an engine holds: NVML's per-process figure when there is one, else its cgroup's.
HOLDINGS = [EngineMetric.GPU_MEMORY, EngineMetric.CONTAINER_MEMORY]
EnginePoints = dict[tuple[int, int], list[SeriesPoint]]

# Events drawn as markers; other kinds (scrape failures, discoveries) would only add noise.
MARKED_EVENTS = {
    "phase-change": "phase change",
    "prefill-stall": "prefill stall",
    "engine-exited": "engine stopped",
    "engine-gone": "container gone",
    "gpu-lost": "GPU lost",
    # The flight recorder's verdict at start-up (collectors.flightrecorder).
    "unexpected-reboot": "unexpected reboot",
    "host-rebooted": "host rebooted",
    "sparkops-unclean-stop": "SparkOps stopped uncleanly",
    # The kernel's log (collectors.kernellog).
    "kernel-oom-kill": "OOM kill",
    "kernel-nvidia-xid": "NVIDIA Xid",
    "kernel-no-memory": "NV_ERR_NO_MEMORY",
    "kernel-hung-task": "hung task",
    "kernel-allocation-failure": "allocation failure",
    "kernel-log-gap": "kernel log lost records",
}
# Plans that never ran are no event on the node.
NOT_RUN = (Restart.Status.SCHEDULED, Restart.Status.CANCELLED, Restart.Status.REFUSED)
MARKER_LIMIT = 300  # per lane, newest kept: hundreds of markers make the lane unreadable
PROCESS_LIMIT = 6  # other processes drawn in the ledger panel, largest first


def timeline(node: Node, range_key: str, now: datetime, max_points: int, interval: float
             ) -> dict:
    """The timeline of ``node`` over ``range_key`` ending at ``now``, as JSON-ready data.

    ``shown_start`` is where the axis starts (:func:`_shown_start`). ``series`` entries carry
    their ``panel``, ``label``, ``unit``, ``engine`` and GPU ``device`` index (or None),
    ``exactness`` ("exact" or "stepwise") and equally long ``x`` (milliseconds since the
    epoch) and ``y`` lists of at most ``max_points``. ``markers`` carry ``at`` (and ``until``
    for a restart's outage; ISO 8601), ``lane``, ``kind``, ``label`` and a hover ``text``.
    ``gpu`` says whether GPU panels are ``shown`` and carries their ``notes`` and ``failures``
    (:class:`GpuHistory`).
    """
    span = RANGES[range_key]
    start = now - span
    resolution = resolution_for(span, interval)
    # Each series is reduced to half the budget: breaking long gaps can add at most one point
    # per point, so the result stays within ``max_points``.
    budget = max(max_points // 2, 3)
    frame = _Frame(start, now, epoch_ms(now), resolution, budget,
                   gap_step_seconds(span, budget, interval, resolution),
                   chart_bucket_seconds(span, budget))
    failures = collection_failures(node, start, now)
    engines = _engines_in_range(node, start)
    host = host_points(node, [spec.metric for spec in HOST_SERIES] + [Metric.SWAP_TOTAL],
                       frame.start, frame.resolution, frame.bucket)
    series = _host_series(host, frame, [epoch_ms(at) for at, _ in failures])
    metrics = [spec[2] for spec in ENGINE_SERIES] + HOLDINGS
    found = engine_points(engines, metrics, frame.start, frame.end, frame.resolution,
                          frame.bucket)
    spans = collected_spans(host[Metric.MEM_AVAILABLE], frame.end_ms, frame.step)
    series += _ledger_series(node, engines, frame, found, spans)
    for engine in engines:
        series += _engine_rate_series(engine, frame, found)
    gpu = gpu_history(node, start=frame.start, end=frame.end, resolution=frame.resolution,
                      budget=frame.budget, step=frame.step, bucket=frame.bucket)
    series += [_entry(line.panel, line.key, line.label, line.unit, line.points,
                      device=line.device) for line in gpu.lines]
    return {
        "node": node.name,
        "range": range_key,
        "start": start.isoformat(),
        "end": now.isoformat(),
        "shown_start": _shown_start(node, start).isoformat(),
        "source": source_label(resolution),
        "max_points": max_points,
        "panels": PANELS + gpu.panels,
        "engines": [engine.name for engine in engines],
        "gpu": gpu.as_dict(),
        "series": series,
        "markers": markers(node, start, now),
        "failures": [{"at": at.isoformat(), "error": error} for at, error in failures],
    }


def _shown_start(node: Node, start: datetime) -> datetime:
    """Where the chart's axis starts: ``start``, or the node's first collection ever when that
    is later (a new install), so the data it has fills the chart instead of a sliver of it.
    Cost: one indexed query."""
    first = Collection.objects.filter(node=node).order_by("at").values_list("at", flat=True) \
        .first()
    return first if first is not None and first > start else start


def _engines_in_range(node: Node, start: datetime) -> list[Engine]:
    """Engines present now, or seen at some point inside the range."""
    engines = list(Engine.objects.filter(node=node)
                   .filter(Q(present=True) | Q(last_seen__gte=start)).order_by("name"))
    for engine in engines:
        engine.node = node  # the roll-up watermark of this request, without a query per engine
    return engines


def _entry(panel: str, key: str, label: str, unit: str, points: Points, *,
           engine: str | None = None, device: int | None = None, exactness: str = "exact",
           scale: float = 1.0) -> dict:
    return {
        "panel": panel, "key": key, "label": label, "unit": unit, "engine": engine,
        "device": device, "exactness": exactness,
        "x": [at for at, _ in points],
        "y": [None if value is None else round(value * scale, 3) for _, value in points],
    }


@dataclass(frozen=True)
class _Frame:
    """What every series of one timeline shares: its range (``end_ms``: its end in epoch
    milliseconds), source, point budget, the longest step a line may bridge (seconds), and the
    width of a chart bucket (seconds)."""

    start: datetime
    end: datetime
    end_ms: int
    resolution: int
    budget: int
    step: float
    bucket: float


def _host_series(found: dict[int, list[SeriesPoint]], frame: _Frame, failed_at: list[int]
                 ) -> list[dict]:
    out = []
    for spec in HOST_SERIES:
        source = found[spec.metric]
        if spec.metric == Metric.SWAP_USED:
            source = swap_where_there_was_swap(source, found[Metric.SWAP_TOTAL])
        points = reduce_series(source, failed_at, frame.budget, frame.step)
        scale = 1 / GIB if spec.unit == "GiB" else 1.0
        out.append(_entry("headroom", spec.key, spec.label, spec.unit, points, scale=scale))
    return out


def swap_where_there_was_swap(used: list[SeriesPoint], total: list[SeriesPoint]
                              ) -> list[SeriesPoint]:
    """Swap in use, without the times the machine had no swap (SwapTotal 0 at that sample or
    throughout that bucket): nothing can be in use there, and a line along 0 would read as
    "swap is fine" where there is none. Those points become gaps."""
    no_swap = {point.at for point in total if point.high == 0}
    if not no_swap:
        return used
    return [SeriesPoint(point.at, None, None) if point.at in no_swap else point
            for point in used]


# --- engine samples ------------------------------------------------------------------------------

def _engine_rate_series(engine: Engine, frame: _Frame, found: EnginePoints) -> list[dict]:
    out = []
    for panel, key, metric, label, scale in ENGINE_SERIES:
        points = reduce_series(found[engine.pk, metric], [], frame.budget, frame.step)
        out.append(_entry(panel, f"{engine.name}:{key}", f"{engine.name} {label}",
                          "%" if panel == "kv" else "tok/s", points, engine=engine.name,
                          scale=scale))
    return out


def _holdings(engine: Engine, frame: _Frame, found: EnginePoints) -> dict:
    """What the engine holds: NVML's per-process figure when there is one in range (GPU
    allocations on GB10), else the container's cgroup, which does not count them."""
    points = found[engine.pk, EngineMetric.GPU_MEMORY]
    source = "NVML per-process"
    if not any(p.high is not None for p in points):
        points = found[engine.pk, EngineMetric.CONTAINER_MEMORY]
        source = "cgroup, without GPU allocations"
    reduced = reduce_series(points, [], frame.budget, frame.step)
    return _entry("ledger", f"{engine.name}:holds", f"{engine.name} holds ({source})", "GiB",
                  reduced, engine=engine.name, scale=1 / GIB)


# --- the ledger, stepwise from its change rows ---------------------------------------------------

Span = tuple[int, int]  # (first, last) in epoch milliseconds
Change = tuple[int, int | None, int | None]  # (epoch milliseconds, before, after) of one row


def collected_spans(points: list[SeriesPoint], end: int, step: float) -> list[Span]:
    """The stretches in which SparkOps collected, oldest first: runs of host points (one per
    collection or bucket, known or not) no further apart than ``step`` seconds. The last
    stretch reaches ``end`` (epoch milliseconds) when its last point is at most ``step``
    before it (still collecting)."""
    limit = step * 1000
    spans: list[Span] = []
    for point in points:
        if spans and point.at - spans[-1][1] <= limit:
            spans[-1] = (spans[-1][0], point.at)
        else:
            spans.append((point.at, point.at))
    if spans and end - spans[-1][1] <= limit:
        spans[-1] = (spans[-1][0], end)
    return spans


def _ledger_series(node: Node, engines: list[Engine], frame: _Frame, found: EnginePoints,
                   spans: list[Span]) -> list[dict]:
    current = node.ledger or {}
    present_engine_ids = {share.get("engine_id") for share in current.get("engines", [])}
    pools = {engine.pk: f"engine:{engine.pk}:kv_pool" for engine in engines}
    changes = ledger_changes(node, list(pools.values()), frame.start, frame.end)
    processes = _largest_processes(changes)
    held = sizes_before(node, list(pools.values()) + processes, frame.start)
    out = []
    for engine in engines:
        out.append(_holdings(engine, frame, found))
        key = pools[engine.pk]
        carry = frame.end_ms if engine.pk in present_engine_ids \
            else epoch_ms(min(engine.last_seen, frame.end))
        points = step_series(changes.get(key, []), held.get(key), carry,
                             appearance_from_zero=True, spans=spans, step=frame.step)
        if points:
            out.append(_entry("ledger", f"{engine.name}:kv_pool", f"{engine.name} KV pool",
                              "GiB", points, engine=engine.name, exactness="stepwise",
                              scale=1 / GIB))
    present = {p.get("name") for p in current.get("processes", [])}
    for component in processes:
        name = component.removeprefix("process:")
        points = step_series(changes[component], held.get(component),
                             frame.end_ms if name in present else None,
                             appearance_from_zero=False, spans=spans, step=frame.step)
        out.append(_entry("ledger", component, f"process {name}", "GiB", points,
                          exactness="stepwise", scale=1 / GIB))
    return out


def ledger_changes(node: Node, components: list[str], start: datetime, end: datetime
                   ) -> dict[str, list[Change]]:
    """The change rows of ``node`` in [start, end] of ``components`` and of every other
    process, by component, oldest first: one query on the ledger's (node, time) index."""
    rows = LedgerChange.objects.filter(node=node, at__gte=start, at__lte=end) \
        .filter(Q(component__in=components) | Q(component__startswith="process:")) \
        .annotate(epoch=EpochMillis("at")).order_by("at") \
        .values_list("component", "epoch", "before_bytes", "after_bytes")
    out: dict[str, list[Change]] = {}
    for component, at, before, after in rows:
        out.setdefault(component, []).append((at, before, after))
    return out


def _largest_processes(changes: dict[str, list[Change]]) -> list[str]:
    """Other processes that moved past the threshold in range, largest first (at most
    ``PROCESS_LIMIT``)."""
    largest = {component: max(after or 0 for _, _, after in rows)
               for component, rows in changes.items() if component.startswith("process:")}
    return sorted(largest, key=lambda c: -largest[c])[:PROCESS_LIMIT]


def sizes_before(node: Node, components: list[str], start: datetime) -> dict[str, int | None]:
    """Each component's size after its last change row before ``start`` (None: no such row),
    in one statement: one subquery per component, each a backward walk of the ledger's
    (node, time) index that stops at the component's latest earlier row."""
    if not components:
        return {}
    parts: list[str] = []
    params: list = []
    for component in components:
        sql, part = LedgerChange.objects.filter(node=node, component=component, at__lt=start) \
            .order_by("-at").values_list("after_bytes")[:1].query.sql_with_params()
        parts.append(f"({sql})")
        params += part
    with connections[LedgerChange.objects.db].cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        return dict(zip(components, cursor.fetchone(), strict=True))


def step_series(rows: list[Change], prior: int | None, carry_until: int | None, *,
                appearance_from_zero: bool, spans: list[Span], step: float) -> Points:
    """A ledger component's size as steps, rebuilt from its change ``rows`` in range (oldest
    first) and ``prior``, its size after its last earlier row (:func:`sizes_before`), drawn
    only inside ``spans`` (the stretches SparkOps collected in, from :func:`collected_spans`).

    Each row becomes a point at its instant with its ``after`` size (the page draws the line as
    steps). Each stretch opens with the size known at its start: the last earlier row's
    ``after``, else (only in the stretch of the first row) that row's ``before``; with
    ``appearance_from_zero`` a first row ``0 → size`` marks when SparkOps first saw the
    component, which was unknown (not 0) before.
    A stretch closes with its last size, up to ``carry_until`` (epoch milliseconds) at the
    latest (None: the component left the ledger, so its line ends at its last row); a None
    separates two stretches. No point lies before the first collection in range.
    """
    # The last earlier row's size held wherever SparkOps collected (a move would have written a
    # row); a first row's ``before`` is only known in the stretch that recorded that row.
    held = None if prior is None else float(prior)
    before: float | None = None
    if prior is None and rows and rows[0][1] is not None \
            and not (appearance_from_zero and rows[0][1] == 0):
        before = float(rows[0][1])
    changes = [(at, None if after is None else float(after)) for at, _, after in rows]
    last_row = changes[-1][0] if changes else None
    until = carry_until if carry_until is not None else last_row
    points: Points = []
    for first, last in _spans_with_rows(spans, [at for at, _ in changes], step):
        inside = [change for change in changes if first <= change[0] <= last]
        known = [value for at, value in changes if at < first]
        opening = known[-1] if known else held
        if not known and held is None and inside and inside[0][0] == changes[0][0]:
            opening = before
        opens_before_rows = not inside or inside[0][0] > first
        if opening is not None and opens_before_rows and (until is None or first <= until):
            inside.insert(0, (first, opening))
        if not inside:
            continue
        close = min(last, until) if until is not None else None
        if close is not None and inside[-1][0] < close:
            inside.append((close, inside[-1][1]))
        if points:
            points.append((points[-1][0] + (inside[0][0] - points[-1][0]) // 2, None))
        points += inside
    return points


def _spans_with_rows(spans: list[Span], instants: list[int], step: float) -> list[Span]:
    """``spans`` widened to hold each row instant within ``step`` seconds of them (a roll-up's
    bucket starts before the rows in it), and a span of its own for a row outside them all."""
    limit = step * 1000
    out = list(spans)
    for at in instants:
        near = next((i for i, (first, last) in enumerate(out)
                     if first - at <= limit and at - last <= limit), None)
        if near is None:
            out.append((at, at))
        else:
            first, last = out[near]
            out[near] = (min(first, at), max(last, at))
    return sorted(out)


# --- markers -------------------------------------------------------------------------------------

def markers(node: Node, start: datetime, end: datetime) -> list[dict]:
    """Restarts, alert changes and engine events of ``node`` in [start, end], oldest first."""
    found = _restart_markers(node, start, end)[-MARKER_LIMIT:]
    found += _alert_markers(node, start, end)[-MARKER_LIMIT:]
    found += _event_markers(node, start, end)[-MARKER_LIMIT:]
    return sorted(found, key=lambda m: m["at"])


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _restart_markers(node: Node, start: datetime, end: datetime) -> list[dict]:
    rows = Restart.objects.filter(node=node).exclude(status__in=NOT_RUN).filter(
        Q(started_at__gte=start, started_at__lte=end) | Q(finished_at__gte=start,
                                                         finished_at__lte=end)
    ).select_related("engine").order_by("started_at")
    out = []
    for restart in rows:
        began = restart.started_at or restart.requested_at
        back = restart.finished_at
        if back is None and restart.startup_seconds is not None:
            back = began + timedelta(seconds=restart.startup_seconds)
        text = f"{restart.kind} restart of {restart.engine.name}: {restart.status}"
        if restart.startup_seconds is not None:
            text += f", ready after {restart.startup_seconds / 60:.1f} min"
        if restart.reason:
            text += f" — {restart.reason[:160]}"
        out.append({
            "at": _iso(began), "until": _iso(back or (end if restart.status == "running"
                                                        else None)),
            "lane": "restarts", "kind": f"restart-{restart.kind}",
            "label": f"{restart.kind} restart", "engine": restart.engine.name,
            "severity": "info" if restart.kind == Restart.Kind.PLANNED else "warning",
            "text": text, "id": restart.pk,
        })
    return out


def _alert_markers(node: Node, start: datetime, end: datetime) -> list[dict]:
    rows = Alert.objects.filter(node=node).filter(
        Q(fired_at__gte=start, fired_at__lte=end) | Q(resolved_at__gte=start,
                                                     resolved_at__lte=end, fired_at__isnull=False)
    ).order_by("fired_at")
    out = []
    for alert in rows:
        moments = [("fired", alert.fired_at), ("resolved", alert.resolved_at)]
        for change, moment in moments:
            if moment is None or not start <= moment <= end:
                continue
            out.append({
                "at": _iso(moment), "lane": "alerts", "kind": f"alert-{change}",
                "label": f"alert {change}", "engine": None, "severity": alert.severity,
                "text": f"{alert.rule} {change} ({alert.severity}): {alert.summary[:200]}",
                "id": alert.pk,
            })
    return out


def _event_markers(node: Node, start: datetime, end: datetime) -> list[dict]:
    rows = Event.objects.filter(node=node, kind__in=list(MARKED_EVENTS), at__gte=start,
                                at__lte=end).order_by("at") \
        .values_list("pk", "at", "kind", "severity", "message", "engine__name")
    return [{
        "at": _iso(at), "lane": "engines", "kind": kind, "label": MARKED_EVENTS[kind],
        "engine": engine, "severity": severity, "text": message[:300], "id": pk,
    } for pk, at, kind, severity, message, engine in rows]
