"""Collect what every LLM engine on a node is: discovered, configured, started, serving.

One call of :func:`collect_engines` lists the engine containers through the container engine,
reads their launch flags, startup logs and bind mounts, reads their endpoints (``/metrics`` for
vLLM; each kind's own, in parallel, each read with a total deadline), computes rates against the
previous read, and stores every engine in one transaction: a failed read commits no samples,
only the reason. A model router (llama-swap) is one engine, and each model it is configured
with is adopted as an engine of its own (``<router>/<model>``, :func:`_adopt_models`), holding
the memory of its own processes (``collectors.adoption``). What is read of each part, and
how, is the engine kind's reader (``collectors.kinds``, chosen by the kind discovery found);
the flow here is the same for all.

Cost: a few queries per collection whatever the number of engines (the node's engines are read
once, samples and events written in bulk), and of an engine's row only the fields that changed
are written.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import docker
from django.db import connection, transaction

from collectors.adoption import Holdings, ModelProcess, attribute
from collectors.docker_api import (
    ContainerEngineError,
    EngineContainer,
    LogCursor,
    discover_engines,
    metrics_base_url,
    read_logs,
)
from collectors.kinds.base import KindReader, Launch, LaunchError, Reading, StartupParser
from collectors.kinds.llamaswap import (
    UNLOADED,
    AdoptedModel,
    RouterReading,
    cmd_words,
    ttl_words,
)
from collectors.kinds.registry import READERS, reader_for
from collectors.modelconfig import activation_bytes_per_token, read_container_model_config
from collectors.models import Engine, EngineMetric, Event, Node, start_identity
from collectors.nvml import GpuReport, processes_by_container
from collectors.procfs import container_ids_for_pids, inode_seen_by_process
from collectors.readings import Sample, engine_readings
from collectors.redaction import mask_command, mask_env, mask_text
from collectors.spanning import ray_node_without_serve, serves_http, span_fields
from collectors.starts import observe_starts
from collectors.vllm.findings import MountCheck
from collectors.vllm.metrics import MetricsSnapshot
from collectors.vllm.rates import Observation, Rates, compute_rates
from collectors.vllm.scrape import ScrapeError
from collectors.vllm.sleep import phase_with_sleep
from sparkops.rowwrites import insert_rows, save_fields

log = logging.getLogger(__name__)

# Startup logs are read on every collection until the engine is ready (phases move then), and
# once a minute after that; each read continues where the last one stopped.
LOG_REFRESH = timedelta(seconds=60)
SCRAPE_DEADLINE_SECONDS = 4.0
SETTLED_PHASES = {"ready", "failed"}
# A container whose config.json was not found is looked into again after this long.
MODEL_CONFIG_RETRY = timedelta(minutes=10)


@dataclass
class ScrapeOutcome:
    reading: Reading | None = None
    error: str = ""


def collect_engines(
    node: Node,
    api: docker.DockerClient | None,
    now: datetime,
    *,
    gpu: GpuReport | None = None,
    proc_root: Path = Path("/proc"),
    api_error: str = "",
) -> list[Engine]:
    """Discover and update every engine of ``node``; return the engines present now.

    ``api`` None (with ``api_error``) means the container engine could not be reached: the
    node records why, and its engines keep their last known state.
    """
    try:
        if api is None:
            raise ContainerEngineError(api_error or "no container engine configured")
        containers = discover_engines(api)
    except ContainerEngineError as error:
        node.engine_discovery_error = str(error)
        node.save(update_fields=["engine_discovery_error"])
        return []
    if node.engine_discovery_error:
        node.engine_discovery_error = ""
        node.save(update_fields=["engine_discovery_error"])
    _forget_logs_except({c.id for c in containers})

    readers = {c.id: reader_for(c.kind) for c in containers}
    launches = {c.id: _launch_of(c, readers[c.id]) for c in containers}
    urls = {c.id: _metrics_url(c, launches[c.id], readers[c.id]) for c in containers}
    outcomes = _scrape_all({cid: url for cid, url in urls.items() if url}, readers)
    gpu_by_container = _gpu_memory_by_container(gpu, proc_root) if gpu else {}

    known = {e.name: e for e in _node_engines(node)}
    present, samples, events = [], [], []
    for container in containers:
        launch = launches[container.id]
        outcome = outcomes.get(container.id)
        holdings = _router_holdings(container, outcome, proc_root) \
            if container.kind == "llamaswap" else None
        gpu_memory = gpu_by_container.get(container.id)
        if holdings is not None:
            gpu_memory = _gpu_by_holder(gpu, holdings, proc_root).get("") if gpu else None
            container = replace(container, memory_usage_bytes=holdings.router_bytes)
        seen = _Seen(container, readers[container.id], launch.config, launch.config_error,
                     urls[container.id], outcome, gpu_memory, launch)
        engine, changed = _update_engine(node, api, known.get(container.name), seen, now,
                                         proc_root, samples, events)
        present.append((engine, changed))
        if container.kind == "llamaswap":
            present += _adopt_models(node, container, urls[container.id], outcome, holdings,
                                     _gpu_by_holder(gpu, holdings, proc_root) if gpu and holdings
                                     else {}, known, now, samples, events)
    with transaction.atomic():
        _write_changed(present)
        insert_rows(engine_readings(samples))
        Event.objects.bulk_create(events)
        _mark_gone(node, known.values(), {e.pk for e, _ in present}, now)
    engines = [engine for engine, _ in present]
    observe_starts(node, engines, now)
    return engines


def _node_engines(node: Node) -> list[Engine]:
    """The node's engine rows, every column, in the model's order (node, name).

    Cost: one query, written here: the ORM spent about 0.35 ms of CPU building it, two thirds
    of what reading four engines' rows costs, and the model's order joined the node table for
    its name, the same in every row.
    """
    quote = connection.ops.quote_name
    meta = Engine._meta
    return list(Engine.objects.raw(
        f"SELECT * FROM {quote(meta.db_table)} WHERE {quote(meta.get_field('node').column)} = %s"
        f" ORDER BY {quote(meta.get_field('name').column)}", [node.pk]))


def _write_changed(present: list[tuple[Engine, list[str]]]) -> None:
    """Write the changed fields of each engine as ``save(update_fields=changed)`` does
    (:func:`sparkops.rowwrites.save_fields`). Cost: one statement per engine that changed,
    and nothing else."""
    for engine, changed in present:
        if changed:
            save_fields(engine, changed)


def _parse_config(container: EngineContainer, reader: KindReader) -> tuple[Launch | None, str]:
    """The launch settings, read from the masked command line (and the masked environment):
    what is stored of them (flag values, the reason a command is refused) never holds a
    secret."""
    try:
        return reader.parse_launch(mask_command(container.command), mask_env(container.env)), ""
    except LaunchError as error:
        ray_node = ray_node_without_serve(container) if container.kind == "vllm" else ""
        return None, ray_node or str(error)


@dataclass(frozen=True)
class _Launched:
    """What a container's launch says, read from its kind, command line, environment and
    labels alone: those masked as they are stored, its launch settings (or why not), its span
    fields and whether it serves its kind's HTTP API (not a headless rank of a spanning engine,
    :func:`collectors.spanning.serves_http`). Each caller gets copies (:meth:`copy`)."""

    command: list[str]
    env: dict[str, str]
    labels: dict[str, str]
    config: Launch | None
    config_error: str
    span_key: str
    span: dict[str, Any]
    serves_api: bool = True

    def copy(self) -> _Launched:
        config = None if self.config is None else replace(self.config,
                                                          config=_json_copy(self.config.config))
        return replace(self, command=list(self.command), env=dict(self.env),
                       labels=dict(self.labels), config=config, span=_json_copy(self.span))


def _json_copy(value: Any) -> Any:
    """A deep copy of JSON-ready data (dicts, lists and tuples of values that cannot change),
    equal to what ``copy.deepcopy`` gives, at a fraction of its CPU: it keeps no memo of parts
    shared within the value, which data written out as JSON text cannot tell apart anyway."""
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_json_copy(item) for item in value)
    return value


# Launch key (kind, command, environment, labels) -> what it says. A container's launch does
# not change while it exists, so it is masked and parsed once, not at every collection.
_launched: dict[tuple, _Launched] = {}
_LAUNCHED_KEPT = 512


def _launch_of(container: EngineContainer, reader: KindReader) -> _Launched:
    """:class:`_Launched` for the container: read once per launch, a copy each time."""
    key = (container.kind, tuple(container.command), tuple(container.env.items()),
           tuple(container.labels.items()))
    found = _launched.get(key)
    if found is None:
        config, config_error = _parse_config(container, reader)
        span_key, span = span_fields(container, config)
        found = _Launched(command=mask_command(container.command), env=mask_env(container.env),
                          labels=mask_env(container.labels), config=config,
                          config_error=config_error, span_key=span_key, span=span,
                          serves_api=serves_http(container, config))
        if len(_launched) >= _LAUNCHED_KEPT:
            _launched.clear()
        _launched[key] = found
    return found.copy()


def _metrics_url(container: EngineContainer, launched: _Launched,
                 reader: KindReader) -> str | None:
    launch = launched.config
    port = launch.port if launch else reader.default_port
    # A headless rank of an engine that spans nodes serves no API: it is not read, so it
    # records no failed read (collectors.spanning).
    serves = container.running and launched.serves_api
    return metrics_base_url(container, port) if serves else None


def _scrape_all(urls: dict[str, str], readers: dict[str, KindReader]
                ) -> dict[str, ScrapeOutcome]:
    """Read every engine at once: one slow engine must not delay the others' samples."""
    if not urls:
        return {}

    def one(cid: str, url: str) -> ScrapeOutcome:
        try:
            return ScrapeOutcome(reading=readers[cid].read(url,
                                                           deadline=SCRAPE_DEADLINE_SECONDS))
        except ScrapeError as error:
            # The reason may quote the URL, whose credentials (a sparkops.url label) stay here.
            return ScrapeOutcome(error=mask_text(str(error)))

    pool = _scrape_pool()
    futures = {cid: pool.submit(one, cid, url) for cid, url in urls.items()}
    return {cid: future.result() for cid, future in futures.items()}


# The threads that read the engines, kept between collections (starting them anew for every
# collection cost more than the reads of a few engines). At most this many reads at once.
SCRAPE_THREADS = 8
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _scrape_pool() -> ThreadPoolExecutor:
    """This process's scrape threads, started on first use (a forked child starts its own)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=SCRAPE_THREADS,
                                       thread_name_prefix="sparkops-scrape")
        return _pool


def _forget_pool_after_fork() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()  # the parent's threads do not exist here


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def _gpu_memory_by_container(gpu: GpuReport, proc_root: Path) -> dict[str, int | None]:
    mapping = container_ids_for_pids(gpu.pids(), proc_root)
    grouped = processes_by_container(gpu, mapping)
    return {cid: use.used_gpu_memory_bytes for cid, use in grouped.items() if cid}


# What a collection sets on an engine's row; of these only the changed ones are written.
_COLLECTED_FIELDS = (
    "kind", "container_id", "image", "container_state", "phase", "started_at", "restart_count",
    "exit_code", "command", "labels", "env", "model_bytes_per_token", "model_config", "config",
    "config_error", "findings", "metrics_url", "memory_usage_bytes", "gpu_memory_bytes",
    "present", "last_seen", "startup", "logs_read_at", "last_scrape_at", "last_scrape_error",
    "last_scrape_ok_at", "metrics", "rates", "span_key", "span",
)


@dataclass(frozen=True)
class _Seen:
    """What one collection saw of one container: its kind's reader, its launch settings (or
    why not), its endpoints' address and read, and its GPU memory."""

    container: EngineContainer
    reader: KindReader
    config: Launch | None
    config_error: str
    url: str | None
    outcome: ScrapeOutcome | None
    gpu_memory: int | None
    launched: _Launched | None = None  # the launch's masked words and span (None: read here)


def _update_engine(node: Node, api: docker.DockerClient, engine: Engine | None, seen: _Seen,
                   now: datetime, proc_root: Path, samples: list[tuple[Engine, Sample]],
                   events: list[Event]) -> tuple[Engine, list[str]]:
    """Fold the container's state into its engine (created when new); add its samples and
    events to the lists. Returns the engine and the names of the fields to write."""
    container = seen.container
    created = engine is None
    if engine is None:
        engine, created = Engine.objects.get_or_create(
            node=node, name=container.name,
            defaults={"container_id": container.id, "container_state": container.state,
                      "started_at": container.started_at, "first_seen": now},
        )
    before = {name: getattr(engine, name) for name in _COLLECTED_FIELDS}
    identity = start_identity(container.id, container.started_at)
    restarted = not created and identity != start_identity(engine.container_id, engine.started_at)
    events += _lifecycle_events(engine, container, now, created=created, restarted=restarted)

    reader = seen.reader
    startup = _read_startup(api, engine, container, reader, restarted or created, now)
    same_kind = engine.kind == container.kind
    known_startup = startup or (reader.startup_from_dict(engine.startup)
                                if engine.startup and same_kind else None)
    reading = seen.outcome.reading if seen.outcome is not None else None
    phase = phase_with_sleep(_phase(container, startup, engine.phase),
                             reading.snapshot if reading is not None else None, engine.phase)
    if isinstance(reading, RouterReading) and container.running:
        phase = "ready"  # a router logs no startup phases: it serves once it answers
    if phase != engine.phase and not created:
        events.append(_event(engine, now, "phase-change", "info",
                             f"{container.name}: {engine.phase} → {phase}"))
    engine.findings = _findings(seen, known_startup, _mount_checks(container, proc_root))
    engine.model_config = refreshed_model_config(
        engine.model_config or {}, container, seen.config.model if seen.config else None,
        proc_root, now)
    _copy_container(engine, seen, phase, now)
    if startup is not None:
        engine.startup = startup.as_dict()
        engine.logs_read_at = now

    samples += _container_samples(engine, now)
    if seen.outcome is not None:
        events += _apply_scrape(engine, reader, seen.outcome, identity, now, samples)
    changed = [name for name, value in before.items()
               if getattr(engine, name) != value or type(getattr(engine, name)) is not type(value)]
    return engine, changed


def _lifecycle_events(engine: Engine, container: EngineContainer, now: datetime, *,
                      created: bool, restarted: bool) -> list[Event]:
    """The event a collection writes when the engine is new, restarted, back or stopped."""
    if created:
        return [_event(engine, now, "engine-discovered", "info",
                       f"Engine {container.name} discovered ({container.state}).")]
    if restarted:
        return [_event(engine, now, "engine-restarted", "warning",
                       f"Engine {container.name} restarted (started "
                       f"{container.started_at:%Y-%m-%d %H:%M:%S} UTC); counters reset."
                       if container.started_at else
                       f"Engine {container.name} was recreated or restarted.")]
    if not engine.present:
        return [_event(engine, now, "engine-discovered", "info",
                       f"Engine {container.name} is back.")]
    if engine.container_state == "running" and not container.running:
        return [_event(engine, now, "engine-exited", "warning",
                       f"Engine {container.name} stopped: container {container.state}, "
                       f"exit code {container.exit_code}"
                       f"{' (killed by the OOM killer)' if container.oom_killed else ''}.")]
    return []


def _findings(seen: _Seen, startup: Any, mounts: list[MountCheck]) -> list[dict[str, str]]:
    """The configuration findings, led by the reason the flags could not be read, if any."""
    findings = seen.reader.findings(seen.config, startup, mounts) if seen.config else []
    if seen.config_error and not (seen.container.kind == "vllm"
                                  and ray_node_without_serve(seen.container)):
        findings.insert(0, {"code": "unparseable-flags", "severity": "error",
                            "message": "SparkOps cannot read the launch flags: "
                                       f"{seen.config_error}"})
    return findings


def _copy_container(engine: Engine, seen: _Seen, phase: str, now: datetime) -> None:
    """Set what the container engine and the scrape address say on the engine's row."""
    container = seen.container
    engine.kind = container.kind
    engine.container_id = container.id
    engine.image = container.image
    engine.container_state = container.state
    engine.phase = phase
    engine.started_at = container.started_at
    engine.restart_count = container.restart_count
    engine.exit_code = container.exit_code
    launched = seen.launched or _Launched(
        mask_command(container.command), mask_env(container.env), mask_env(container.labels),
        seen.config, seen.config_error, *span_fields(container, seen.config))
    # Stored masked only: the flags SparkOps reads come from the masked command too.
    engine.command = launched.command
    engine.labels = launched.labels
    engine.env = launched.env
    engine.model_bytes_per_token = _model_bytes_per_token(seen.config, engine.model_config) \
        or engine.model_bytes_per_token
    engine.config = seen.config.config if seen.config else {}
    engine.config_error = seen.config_error
    engine.metrics_url = seen.url or ""
    engine.memory_usage_bytes = container.memory_usage_bytes
    engine.gpu_memory_bytes = seen.gpu_memory
    engine.present = True
    engine.last_seen = now
    engine.span_key, engine.span = launched.span_key, launched.span


@dataclass
class _FollowedLog:
    """A container's log as far as it was read: where the next read continues (``cursor``, or
    ``since`` before anything stamped was read), the parse so far, and whether output was left
    waiting by the last read's cap."""

    since: datetime | None
    parser: StartupParser
    kind: str
    cursor: LogCursor | None = None
    more_waiting: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


# Container id -> its log so far, in this worker process (a new process reads each log once more,
# from the container's latest start). Forgotten when the container is gone.
_followed: dict[str, _FollowedLog] = {}
_followed_lock = threading.Lock()
# How far before the container's recorded start its first read begins: the engine may stamp the
# first lines before it records the start time.
_START_SLACK = timedelta(seconds=1)


def _forget_logs_except(present: set[str]) -> None:
    with _followed_lock:
        for gone in _followed.keys() - present:
            _followed.pop(gone, None)


def _read_startup(api: docker.DockerClient, engine: Engine, container: EngineContainer,
                  reader: KindReader, fresh: bool, now: datetime) -> Any:
    """Parse the new part of the startup log with the kind's parser when it can have changed;
    None when the last parse still holds (or another collection is reading this log now)."""
    with _followed_lock:
        followed = _followed.get(container.id)
        if followed is None or followed.kind != container.kind:
            since = container.started_at - _START_SLACK if container.started_at else None
            followed = _followed[container.id] = _FollowedLog(
                since=since, parser=reader.new_log_parser(), kind=container.kind)
            fresh = True
    due = (
        fresh
        or followed.more_waiting
        or engine.phase not in SETTLED_PHASES
        or engine.logs_read_at is None
        or now - engine.logs_read_at >= LOG_REFRESH
        or container.state != engine.container_state
    )
    if not due or not followed.lock.acquire(blocking=False):
        return None
    try:
        read = read_logs(api, container.id, cursor=followed.cursor,
                         since=followed.since, tty=container.tty)
        followed.parser.feed(read.text)
        followed.cursor = read.cursor or followed.cursor
        followed.more_waiting = read.capped
        return followed.parser.result()
    except ContainerEngineError as error:
        log.warning("%s", error)
        return None
    finally:
        followed.lock.release()


def _phase(container: EngineContainer, startup: Any, previous: str) -> str:
    """The engine's phase: from its log while the container runs; stopped or failed otherwise."""
    logged = startup.phase if startup is not None else previous
    if container.running:
        # Running but nothing recognisable logged yet: the process is still coming up.
        return "starting" if logged in ("unknown", "stopped", "gone") else logged
    if logged == "failed" or (container.exit_code not in (None, 0)):
        return "failed"
    return "stopped"


def refreshed_model_config(stored: dict[str, Any], container: EngineContainer,
                           model: str | None, proc_root: Path, now: datetime) -> dict[str, Any]:
    """What ``Engine.model_config`` becomes at this collection: ``stored`` (the row's value),
    or the model's config.json read anew inside the running container.

    Read once per container start (again every :data:`MODEL_CONFIG_RETRY` while none was
    found); what was read last is kept while the container is stopped.
    """
    identity = start_identity(container.id, container.started_at)
    if not container.running:
        return stored
    if stored.get("identity") == identity:
        read_at = stored.get("read_at")
        if stored.get("config") is not None or (
                read_at and now - datetime.fromisoformat(read_at) < MODEL_CONFIG_RETRY):
            return stored
    # The unmasked environment only locates the hub cache; it is not stored.
    config, source = read_container_model_config(model, container.env or {},
                                                 container.pid or None, proc_root)
    return {"config": config, "source": source, "identity": identity,
            "read_at": now.isoformat()}


def _model_bytes_per_token(config: Launch | None, model_config: dict[str, Any]
                           ) -> int | None:
    """Activation bytes per batched token from the model's config.json, for an engine started
    from a local model directory (a hub model's estimate is left to the admin's setting)."""
    if not (config and config.model and config.model.startswith("/")):
        return None
    return activation_bytes_per_token(model_config.get("config"))


def _mount_checks(container: EngineContainer, proc_root: Path) -> list[MountCheck]:
    """Bind mounts as the container sees them versus the host now (the stale-inode trap)."""
    if not container.running or not container.pid:
        return []
    checks = []
    for mount in container.mounts:
        if mount.type != "bind":
            continue
        try:
            host_inode: int | None = os.stat(mount.source).st_ino
            host_exists = True
        except FileNotFoundError:
            host_inode, host_exists = None, False
        except OSError:
            host_inode, host_exists = None, True
        checks.append(MountCheck(
            source=mount.source,
            destination=mount.destination,
            container_inode=inode_seen_by_process(container.pid, mount.destination, proc_root),
            host_inode=host_inode,
            host_exists=host_exists,
        ))
    return checks


def _container_samples(engine: Engine, now: datetime) -> list[tuple[Engine, Sample]]:
    samples = []
    if engine.memory_usage_bytes is not None:
        samples.append((engine, Sample(EngineMetric.CONTAINER_MEMORY, now,
                                       engine.memory_usage_bytes)))
    if engine.gpu_memory_bytes is not None:
        samples.append((engine, Sample(EngineMetric.GPU_MEMORY, now, engine.gpu_memory_bytes)))
    return samples


_RATE_METRICS = {
    "prefill_tokens_per_s": EngineMetric.PREFILL_TPS,
    "decode_tokens_per_s": EngineMetric.DECODE_TPS,
    "ttft_p50_s": EngineMetric.TTFT_P50,
    "ttft_p95_s": EngineMetric.TTFT_P95,
    "itl_p50_s": EngineMetric.ITL_P50,
    "itl_p95_s": EngineMetric.ITL_P95,
    "prefix_cache_hit_rate": EngineMetric.PREFIX_CACHE_HIT_RATE,
    "spec_decode_acceptance_rate": EngineMetric.SPEC_ACCEPTANCE,
    "spec_decode_mean_acceptance_length": EngineMetric.SPEC_TOKENS_PER_STEP,
    "preemptions_per_s": EngineMetric.PREEMPTIONS_PER_S,
}
_GAUGE_METRICS = {
    "requests_running": EngineMetric.REQUESTS_RUNNING,
    "requests_waiting": EngineMetric.REQUESTS_WAITING,
    "kv_cache_usage": EngineMetric.KV_CACHE_USAGE,
}


def _apply_scrape(engine: Engine, reader: KindReader, outcome: ScrapeOutcome, identity: str,
                  now: datetime, samples: list[tuple[Engine, Sample]]) -> list[Event]:
    """Fold one read into the engine; on failure keep the last good data and say why.

    ``metrics`` keeps the read's snapshot (the next read's rates start from it), what only this
    kind reports (``details``) and, for each part this kind cannot report, why (``unknown``).
    """
    events: list[Event] = []
    engine.last_scrape_at = now
    reading = outcome.reading
    if reading is None:
        if not engine.last_scrape_error:
            events.append(_event(engine, now, "scrape-failed", "warning",
                                 f"{engine.name}: {reader.endpoints} scrape failed: "
                                 f"{outcome.error}"))
        engine.last_scrape_error = outcome.error
        return events
    if engine.last_scrape_error:
        events.append(_event(engine, now, "scrape-recovered", "info",
                             f"{engine.name}: {reader.endpoints} answers again."))
    engine.last_scrape_error = ""
    engine.last_scrape_ok_at = now
    current = Observation(reading.snapshot, now.timestamp(), identity)
    rates = _rates_since_last(engine, current)
    snapshot = reading.snapshot.as_dict()
    engine.metrics = {"snapshot": snapshot, "wall_time": current.wall_time,
                      "identity": identity, "details": reading.details,
                      "unknown": {**reader.never_reported, **reading.unknown}}
    engine.rates = rates.as_dict() if rates else {}
    if rates is not None and rates.restarted and "identity" not in (rates.reason or ""):
        events.append(_event(engine, now, "counters-reset", "warning",
                             f"{engine.name}: counters went back ({rates.reason}); "
                             "the engine restarted, no rate for this interval."))
    for key, metric in _GAUGE_METRICS.items():
        if snapshot.get(key) is not None:
            samples.append((engine, Sample(metric, now, snapshot[key])))
    for key, metric in _RATE_METRICS.items():
        value = getattr(rates, key, None) if rates else None
        if value is not None:
            samples.append((engine, Sample(metric, now, value)))
    return events


def _rates_since_last(engine: Engine, current: Observation) -> Rates | None:
    previous_state = engine.metrics or {}
    if "snapshot" not in previous_state:
        return None
    previous = Observation(
        MetricsSnapshot.from_dict(previous_state["snapshot"]),
        previous_state["wall_time"],
        previous_state.get("identity"),
    )
    return compute_rates(previous, current)


def _mark_gone(node: Node, known: Iterable[Engine], present_ids: set[int], now: datetime) -> None:
    gone = [e for e in known if e.present and e.pk not in present_ids]
    if not gone:
        return
    Event.objects.bulk_create([
        Event(node=node, engine=engine, at=now, kind="engine-gone", severity="warning",
              message=f"Engine {engine.name}'s container is gone.")
        for engine in gone
    ])
    Engine.objects.filter(pk__in=[e.pk for e in gone], present=True) \
        .update(present=False, phase="gone")


def _event(engine: Engine, at: datetime, kind: str, severity: str, message: str) -> Event:
    return Event(node=engine.node, engine=engine, at=at, kind=kind, severity=severity,
                 message=message)


# --- models adopted from a router ---------------------------------------------------------------

# A router's model process state (llama-swap's) -> the adopted engine's phase.
_ADOPTED_PHASES = {"starting": "loading", "ready": "ready", "stopping": "stopping",
                   UNLOADED: UNLOADED}
_ADOPTED_UNKNOWN = {
    "weights": "a model run by llama-swap logs into the router's log, interleaved with the "
               "router's own lines and its other models'; SparkOps does not read it",
    "cuda_graphs": "a model run by llama-swap logs into the router's log; not read",
}


def _router_holdings(container: EngineContainer, outcome: ScrapeOutcome | None,
                     proc_root: Path) -> Holdings | None:
    """The router's and its running models' own memory, from the container's process tree;
    None when the router was not read (stopped, or its read failed): then what is running in
    it is not known, and the router's memory is not split."""
    reading = outcome.reading if outcome is not None else None
    if not isinstance(reading, RouterReading) or not container.running:
        return None
    running = [ModelProcess(m.name, tuple(cmd_words(m.cmd or ""))) for m in reading.models
               if m.running]
    return attribute(container.pid, running, proc_root)


def _gpu_by_holder(gpu: GpuReport, holdings: Holdings, proc_root: Path) -> dict[str, int | None]:
    """NVML's per-process GPU memory, summed by holder (the router: ""; else the model)."""
    owner = {pid: name for name, pids in holdings.pids.items() for pid in pids}
    grouped = processes_by_container(gpu, owner)
    return {name: use.used_gpu_memory_bytes for name, use in grouped.items() if name is not None}


def _adopt_models(node: Node, router: EngineContainer, url: str | None,
                  outcome: ScrapeOutcome | None, holdings: Holdings | None,
                  gpu_by_model: dict[str, int | None], known: dict[str, Engine], now: datetime,
                  samples: list[tuple[Engine, Sample]], events: list[Event]
                  ) -> list[tuple[Engine, list[str]]]:
    """Each configured model of ``router`` as an engine row of its own.

    While the router's read fails, its models keep their last known state (they are not gone:
    the router's own row says why it is not read); once its container stops, every model is
    unloaded (its processes went with it).
    """
    prefix = f"{router.name}/"
    stored = {name[len(prefix):]: engine for name, engine in known.items()
              if name.startswith(prefix) and (engine.config or {}).get("router") == router.name}
    reading = outcome.reading if outcome is not None else None
    if isinstance(reading, RouterReading):
        models = list(reading.models)
    elif router.running and outcome is not None:
        return [(engine, []) for engine in stored.values() if engine.present]
    else:
        models = [AdoptedModel(name=name, state=UNLOADED, listed=True) for name in stored]
    return [_adopt_one(node, router, url, model, holdings, gpu_by_model, stored.get(model.name),
                       now, samples, events) for model in models]


def _adopt_one(node: Node, router: EngineContainer, url: str | None, model: AdoptedModel,
               holdings: Holdings | None, gpu_by_model: dict[str, int | None],
               engine: Engine | None, now: datetime, samples: list[tuple[Engine, Sample]],
               events: list[Event]) -> tuple[Engine, list[str]]:
    """Fold one model of a router into its engine row (created when new)."""
    name = f"{router.name}/{model.name}"
    created = engine is None
    if engine is None:
        engine, created = Engine.objects.get_or_create(
            node=node, name=name,
            defaults={"container_id": router.id, "container_state": router.state,
                      "started_at": router.started_at, "first_seen": now})
    before = {field_name: getattr(engine, field_name) for field_name in _COLLECTED_FIELDS}
    if created:
        events.append(_event(engine, now, "engine-discovered", "info",
                             f"Model {model.name} of router {router.name} adopted as engine "
                             f"{name} ({model.state})."))
    elif not engine.present:
        events.append(_event(engine, now, "engine-discovered", "info", f"Engine {name} is back."))
    phase = _ADOPTED_PHASES.get(model.state, model.state) if router.running else UNLOADED
    if phase != engine.phase and not created:
        events.append(_event(engine, now, "phase-change", "info",
                             f"{name}: {engine.phase} → {phase}"))
    previous = engine.config or {}
    kind = model.kind or (engine.kind if not created else "unknown")
    reader = READERS.get(kind)
    launch, launch_error = None, ""
    if model.cmd and reader is not None:
        try:
            launch = reader.parse_launch(mask_command(cmd_words(model.cmd)), {})
        except LaunchError as error:
            launch_error = str(error)
    ttl = model.ttl if model.ttl is not None else previous.get("ttl_seconds")
    launch_config = launch.config if launch else ({} if model.cmd else {
        key: value for key, value in previous.items() if key not in _ADOPTION_KEYS})
    engine.config = {**launch_config, "router": router.name, "router_model": model.name,
                     "ttl_seconds": ttl, "ttl_words": ttl_words(ttl),
                     "proxy": model.proxy or previous.get("proxy")}
    engine.config_error = launch_error
    engine.kind = kind
    engine.container_id = router.id
    engine.image = router.image
    engine.container_state = router.state
    engine.phase = phase
    engine.started_at = router.started_at
    engine.restart_count = router.restart_count
    engine.exit_code = router.exit_code
    if model.cmd:
        engine.command = mask_command(cmd_words(model.cmd))
    # The router's labels and environment are the router's: a model never inherits
    # sparkops.manage (restarting it would restart the router and every other model).
    engine.labels, engine.env = {}, {}
    engine.findings = reader.findings(launch, None, []) if reader and launch else []
    engine.metrics_url = f"{url}/upstream/{model.name}" if url else ""
    running = phase != UNLOADED
    memory_reason = ""
    if not running:
        engine.memory_usage_bytes, engine.gpu_memory_bytes = 0, None
    elif holdings is None:
        engine.memory_usage_bytes, engine.gpu_memory_bytes = None, None
        memory_reason = "the router's processes were not read"
    else:
        engine.memory_usage_bytes = holdings.model_bytes.get(model.name)
        engine.gpu_memory_bytes = gpu_by_model.get(model.name)
        memory_reason = holdings.reasons.get(model.name, "")
    engine.present = True
    engine.last_seen = now
    samples += _container_samples(engine, now)
    pids = sorted(holdings.pids.get(model.name, ())) if holdings else []
    identity = f"{start_identity(router.id, router.started_at)}/{model.name}@{pids[:1]}"
    if model.reading is not None or model.read_error:
        events += _apply_scrape(engine, reader or reader_for(kind),
                                ScrapeOutcome(reading=model.reading, error=model.read_error),
                                identity, now, samples)
    else:
        engine.last_scrape_error = ""
        engine.metrics, engine.rates = {"details": {}, "unknown": {}}, {}
    unknown = {**_ADOPTED_UNKNOWN, **model.unknown}
    if not running:
        unknown["rates"] = (f"not loaded: llama-swap has not started it or stopped it "
                            f"({ttl_words(ttl)}); it loads on the next request for it")
    if memory_reason:
        unknown["memory"] = memory_reason
    metrics = dict(engine.metrics or {})
    metrics["details"] = {**(metrics.get("details") or {}),
                          "router": router.name, "router_state": model.state,
                          "listed": model.listed, "ttl_words": ttl_words(ttl),
                          "state": f"{model.state} in llama-swap {router.name}; "
                                   f"{ttl_words(ttl)}"}
    metrics["unknown"] = {**(metrics.get("unknown") or {}), **unknown}
    engine.metrics = metrics
    changed = [field_name for field_name, value in before.items()
               if getattr(engine, field_name) != value
               or type(getattr(engine, field_name)) is not type(value)]
    return engine, changed


# What adoption adds to a model's launch settings (kept apart from the kind's own).
_ADOPTION_KEYS = {"router", "router_model", "ttl_seconds", "ttl_words", "proxy"}
