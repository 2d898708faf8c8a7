"""Nodes and the time-series tables their samples live in.

Every sample belongs to a node, so one central SparkOps can watch a fleet of GB10s.
Raw samples are stored a row per collection: :class:`HostReading` holds one collection's host
figures and :class:`EngineReading` one engine's figures of one collection, a column per metric
(about 70 values per collection at four engines: a row each cost more in row headers and index
entries than in figures). ``collectors.readings`` is the one place that maps a metric to its
column. Roll-ups stay narrow (node or engine, metric, bucket): a chart over days reads one
(metric, range) slice of their index. GPU samples stay narrow too: a GB10 has one GPU.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone


class Node(models.Model):
    """A machine being watched. Total memory is read from it, never assumed (GB10 units differ)."""

    name = models.SlugField(max_length=64, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    mem_total_bytes = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_collection_at = models.DateTimeField(null=True, blank=True)
    # Samples before this instant are rolled up into per-minute rows (see collectors.retention).
    rolled_up_until = models.DateTimeField(null=True, blank=True)
    # The latest NVML report (collectors.nvml.GpuReport.as_dict) and when it was read.
    gpu = models.JSONField(default=dict, blank=True)
    gpu_read_at = models.DateTimeField(null=True, blank=True)
    # Why engines could not be listed at the last try ("" when the container engine answered).
    engine_discovery_error = models.TextField(blank=True)
    # The latest memory ledger (collectors.ledger.Ledger.as_dict) and, per component, the
    # amount at its last recorded change (what the next change is measured against).
    ledger = models.JSONField(default=dict, blank=True)
    ledger_baseline = models.JSONField(default=dict, blank=True)
    # The node's own worker (``bin/sparkops agent``, or the one-node stack's worker): when it
    # last registered the node, and its heartbeat (collectors.heartbeat). ``heartbeat_at`` is the
    # database's clock, the centre's, at the last beat; ``clock_skew_seconds`` the node's clock
    # less the centre's then (positive: the node runs ahead). A node no worker ever registered
    # has neither and is judged by its collections alone.
    agent_started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    clock_skew_seconds = models.FloatField(null=True, blank=True)
    # What the node's worker read of the node when it registered (collectors.registration):
    # {"read_at": ISO time, "items": {key: {"value": text or None, "source": where read,
    #  "unknown": why not, when value is None}}, "interconnect": [port, ...]}.
    facts = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        from sparkops.celery import node_queue

        return node_queue(self.name)


class Metric(models.IntegerChoices):
    """Host-memory series. Values are stored ids: never renumber, only add."""

    MEM_TOTAL = 1, "MemTotal"
    MEM_FREE = 2, "MemFree"
    MEM_AVAILABLE = 3, "MemAvailable"
    MEM_AVAILABLE_MIN = 4, "MemAvailable (interval minimum)"
    BUFFERS = 5, "Buffers"
    CACHED = 6, "Cached"
    SRECLAIMABLE = 7, "SReclaimable"
    SHMEM = 8, "Shmem"
    DIRTY = 9, "Dirty"
    SWAP_TOTAL = 10, "SwapTotal"
    SWAP_FREE = 11, "SwapFree"
    CMA_FREE = 12, "CmaFree"
    PAGE_CACHE_RECLAIMABLE = 13, "Reclaimable page cache"
    SWAP_USED = 14, "Swap in use"
    PSI_SOME_AVG10 = 15, "Memory pressure, some (avg10 %)"
    PSI_FULL_AVG10 = 16, "Memory pressure, full (avg10 %)"
    # The node's memory budget (SPARKOPS_MEMORY_BUDGET_CGROUP), when its engines run in one.
    MEMORY_BUDGET_LIMIT = 17, "Memory budget limit"
    MEMORY_BUDGET_ROOM = 18, "Room in the memory budget"
    MEMORY_BUDGET_ROOM_MIN = 19, "Room in the memory budget (interval minimum)"
    # Fragmentation (collectors.fragmentation): /proc/buddyinfo of the zones ordinary
    # allocations come from, and the direct-compaction counters of /proc/vmstat as rates.
    BUDDY_FREE = 20, "Free in the buddy allocator"
    FREE_IN_HUGE_BLOCKS = 21, "Free in huge-page-sized blocks"
    LARGEST_FREE_BLOCK = 22, "Largest free block"
    COMPACT_STALLS_PER_MIN = 23, "Compaction stalls (per minute)"
    COMPACT_FAILS_PER_MIN = 24, "Compaction failures (per minute)"


class Collection(models.Model):
    """One attempt to collect a node's host memory; a failed one is a gap with its reason."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="collections")
    at = models.DateTimeField()
    window_started_at = models.DateTimeField()
    reads = models.PositiveIntegerField(default=0)
    ok = models.BooleanField()
    error = models.TextField(blank=True)

    class Meta:
        indexes = [
            # Serves "latest collection of node N" and "collections of node N in a range".
            models.Index(fields=["node", "at"], name="collection_node_at"),
            # Serves "last failure of node N" without walking every successful collection.
            models.Index(fields=["node", "at"], name="collection_failed_node_at",
                         condition=models.Q(ok=False)),
        ]
        ordering = ["-at"]


class HostReading(models.Model):
    """One collection's host figures: a column per :class:`Metric` (its name in lower case).

    A figure is NULL when it was not read (a budget that is not watched) or was unknown at that
    instant; ``notes`` then says why, by metric id, for each figure that was read as unknown.
    ``at`` is the collection's time; an interval minimum has its own (``*_min_at``), the instant
    it was seen, so a dip is drawn where it happened. Read and written through
    ``collectors.readings``.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    at = models.DateTimeField()
    mem_total = models.FloatField(null=True)
    mem_free = models.FloatField(null=True)
    mem_available = models.FloatField(null=True)
    mem_available_min = models.FloatField(null=True)
    mem_available_min_at = models.DateTimeField(null=True)  # when it was seen
    buffers = models.FloatField(null=True)
    cached = models.FloatField(null=True)
    sreclaimable = models.FloatField(null=True)
    shmem = models.FloatField(null=True)
    dirty = models.FloatField(null=True)
    swap_total = models.FloatField(null=True)
    swap_free = models.FloatField(null=True)
    cma_free = models.FloatField(null=True)
    page_cache_reclaimable = models.FloatField(null=True)
    swap_used = models.FloatField(null=True)
    psi_some_avg10 = models.FloatField(null=True)
    psi_full_avg10 = models.FloatField(null=True)
    memory_budget_limit = models.FloatField(null=True)
    memory_budget_room = models.FloatField(null=True)
    memory_budget_room_min = models.FloatField(null=True)
    memory_budget_room_min_at = models.DateTimeField(null=True)  # when it was seen
    buddy_free = models.FloatField(null=True)
    free_in_huge_blocks = models.FloatField(null=True)
    largest_free_block = models.FloatField(null=True)
    compact_stalls_per_min = models.FloatField(null=True)
    compact_fails_per_min = models.FloatField(null=True)
    notes = models.JSONField(default=dict, blank=True)

    class Meta:
        # Every chart, rule and prune query is "node N, time range".
        constraints = [models.UniqueConstraint(fields=["node", "at"], name="hostreading_node_at")]


class Rollup(models.Model):
    """Min/mean/max of a host metric over one bucket of ``resolution`` seconds.

    Roll-ups come in tiers (``collectors.retention.TIERS``): per minute, per quarter hour and per
    hour, each kept longer than the one before, so a chart over any range reads a few thousand
    rows at most and a dip survives every tier as its bucket's minimum.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    metric = models.PositiveSmallIntegerField(choices=Metric.choices)
    resolution = models.PositiveIntegerField(default=60)  # bucket width in seconds
    start = models.DateTimeField()
    min = models.FloatField()
    max = models.FloatField()
    mean = models.FloatField()
    count = models.PositiveIntegerField()  # raw samples behind the bucket

    class Meta:
        # A chart reads (node, metric, resolution, time range) and only min and max: with them in
        # the index it never touches the table. One row per bucket is kept by the roll-up, which
        # replaces buckets whole under a compare-and-set of the node's watermark.
        indexes = [models.Index(fields=["node", "metric", "resolution", "start", "min", "max"],
                                name="rollup_bucket_covering")]


MANAGE_LABEL = "sparkops.manage"


def start_identity(container_id: str, started_at: datetime | None) -> str:
    """One container start: its id and start time (a new id or start time is a restart). What
    an engine read from its endpoints or its files records, to be told apart from what an
    earlier start of the same engine left."""
    return f"{container_id}@{started_at.isoformat() if started_at else '?'}"


class Engine(models.Model):
    """An LLM engine container on a node, known by its container name.

    A container recreated under the same name is the same engine (its history continues); a new
    container id or start time is recorded as a restart.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="engines")
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=32, default="vllm")
    container_id = models.CharField(max_length=64)
    image = models.CharField(max_length=512, blank=True)
    container_state = models.CharField(max_length=32)
    phase = models.CharField(max_length=32, default="unknown")
    started_at = models.DateTimeField(null=True, blank=True)
    restart_count = models.PositiveIntegerField(default=0)
    exit_code = models.IntegerField(null=True, blank=True)
    command = models.JSONField(default=list)
    config = models.JSONField(default=dict)  # parsed launch flags (collectors.vllm.flags)
    config_error = models.TextField(blank=True)
    startup = models.JSONField(default=dict)  # what the startup log told (collectors.vllm.logs)
    findings = models.JSONField(default=list)  # [{code, severity, message}]
    labels = models.JSONField(default=dict)  # container labels (sparkops.* settings live here)
    # The container's environment, secrets masked (collectors.redaction.mask_env).
    env = models.JSONField(default=dict)
    # SparkOps may stop and start this container: set by an admin, or by the container label
    # ``sparkops.manage=true``. Nothing else is ever touched.
    managed = models.BooleanField(default=False)
    metrics_url = models.CharField(max_length=512, blank=True)
    memory_usage_bytes = models.BigIntegerField(null=True, blank=True)  # cgroup: excludes GPU
    gpu_memory_bytes = models.BigIntegerField(null=True, blank=True)  # NVML per-process, if any
    metrics = models.JSONField(default=dict)  # last successful scrape (collectors.vllm.metrics)
    rates = models.JSONField(default=dict)  # last computed rates (collectors.vllm.rates)
    last_scrape_at = models.DateTimeField(null=True, blank=True)
    last_scrape_ok_at = models.DateTimeField(null=True, blank=True)
    last_scrape_error = models.TextField(blank=True)
    logs_read_at = models.DateTimeField(null=True, blank=True)
    # Transient prefill need: bytes of activation per batched token, set by an admin or read from
    # the model's config.json; and the largest host-memory dip seen while it alone prefilled.
    prefill_bytes_per_token = models.PositiveIntegerField(null=True, blank=True)
    model_bytes_per_token = models.PositiveIntegerField(null=True, blank=True)
    # The model's config.json as the container serves it, read on the node by its collector
    # (collectors.modelconfig): {"config": {...} or None, "source": where found or why not,
    # "identity": the container start it was read for}. Pages read it from here.
    model_config = models.JSONField(default=dict)
    prefill_observed_bytes = models.BigIntegerField(null=True, blank=True)
    prefill_observed_at = models.DateTimeField(null=True, blank=True)
    present = models.BooleanField(default=True)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    # An engine that spans nodes (tensor/pipeline/data parallel over Ray, vLLM's own executor or
    # SGLang's): every rank is an Engine row on its own node, and the rows of one engine share
    # ``span_key`` (empty for an engine on one node). ``span`` says which rank this row is and
    # what the key was read from (collectors.spanning).
    span_key = models.CharField(max_length=255, blank=True, db_index=True)
    span = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["node", "name"]
        constraints = [
            models.UniqueConstraint(fields=["node", "name"], name="engine_unique_name_per_node")
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.name}"

    @property
    def start_identity(self) -> str:
        """The container start the engine row describes now (:func:`start_identity`)."""
        return start_identity(self.container_id, self.started_at)

    @property
    def manageable(self) -> bool:
        """May SparkOps stop and start it? An admin's setting, or ``sparkops.manage=true``.
        Never a model adopted from a router (llama-swap): its container is the router's, and
        restarting it would restart the router and every other model it runs."""
        if (self.config or {}).get("router"):
            return False
        return self.managed or (self.labels or {}).get(MANAGE_LABEL, "").lower() == "true"


class EngineStart(models.Model):
    """One start of an engine (a container start): what SparkOps predicted it would reserve when
    it saw it starting, and what the engine reported once ready (collectors.starts).

    ``predicted`` and ``actual`` map a figure's name (``weights``, ``kv_pool``, ``cuda_graphs``,
    ``held``, ``kv_tokens``, ``concurrency``, ``prefill_need``, ``free_at_boot``,
    ``startup_seconds``) to ``{"value": number or None, "confidence": ..., "basis": ...}``; an
    unknown figure has value None and says why, never 0. ``no_prediction`` says why nothing was
    predicted (the engine was first seen after its pool was allocated, its release is not
    modelled, ...). ``corrections`` names what earlier starts changed in the prediction.
    """

    class Outcome(models.TextChoices):
        STARTING = "starting"
        READY = "ready"
        FAILED = "failed"
        GONE = "gone"  # stopped, removed or started again before it was ready

    engine = models.ForeignKey(Engine, on_delete=models.CASCADE, related_name="starts")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    identity = models.CharField(max_length=128)  # container id @ container start time
    container_started_at = models.DateTimeField(null=True, blank=True)
    seen_at = models.DateTimeField()
    version = models.CharField(max_length=64, blank=True)
    model = models.CharField(max_length=512, blank=True)
    config = models.JSONField(default=dict)  # the launch flags of this start
    predicted_at = models.DateTimeField(null=True, blank=True)
    predicted = models.JSONField(default=dict)
    no_prediction = models.TextField(blank=True)
    corrections = models.JSONField(default=list)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.STARTING)
    finished_at = models.DateTimeField(null=True, blank=True)  # ready, failed or gone
    actual = models.JSONField(default=dict)

    class Meta:
        ordering = ["-seen_at", "-pk"]
        constraints = [
            models.UniqueConstraint(fields=["engine", "identity"], name="enginestart_one_per_start")
        ]
        indexes = [models.Index(fields=["node", "outcome"], name="enginestart_node_outcome")]

    def __str__(self) -> str:
        return f"start of {self.engine} at {self.container_started_at or self.seen_at}"


class EngineMetric(models.IntegerChoices):
    """Per-engine series. Stored ids: never renumber, only add."""

    REQUESTS_RUNNING = 1, "Requests running"
    REQUESTS_WAITING = 2, "Requests waiting"
    KV_CACHE_USAGE = 3, "KV cache usage (0–1)"
    PREFILL_TPS = 4, "Prefill tok/s"
    DECODE_TPS = 5, "Decode tok/s"
    TTFT_P50 = 6, "TTFT p50 (s)"
    TTFT_P95 = 7, "TTFT p95 (s)"
    ITL_P50 = 8, "Inter-token latency p50 (s)"
    ITL_P95 = 9, "Inter-token latency p95 (s)"
    PREFIX_CACHE_HIT_RATE = 10, "Prefix-cache hit rate"
    SPEC_ACCEPTANCE = 11, "Speculative acceptance rate"
    PREEMPTIONS_PER_S = 12, "Preemptions/s"
    CONTAINER_MEMORY = 13, "Container memory (cgroup)"
    GPU_MEMORY = 14, "GPU memory (NVML)"
    # Speculative decoding: tokens one step of a request yields, 1 + accepted / drafts (vLLM's
    # "mean acceptance length"); its acceptance rate is SPEC_ACCEPTANCE.
    SPEC_TOKENS_PER_STEP = 15, "Speculative tokens per step"


class EngineReading(models.Model):
    """One engine's figures of one collection: a column per :class:`EngineMetric` (its name in
    lower case), NULL where the engine did not report it; ``notes`` as on :class:`HostReading`.
    Read and written through ``collectors.readings``."""

    engine = models.ForeignKey(Engine, on_delete=models.CASCADE, related_name="+", db_index=False)
    at = models.DateTimeField()
    requests_running = models.FloatField(null=True)
    requests_waiting = models.FloatField(null=True)
    kv_cache_usage = models.FloatField(null=True)
    prefill_tps = models.FloatField(null=True)
    decode_tps = models.FloatField(null=True)
    ttft_p50 = models.FloatField(null=True)
    ttft_p95 = models.FloatField(null=True)
    itl_p50 = models.FloatField(null=True)
    itl_p95 = models.FloatField(null=True)
    prefix_cache_hit_rate = models.FloatField(null=True)
    spec_acceptance = models.FloatField(null=True)
    preemptions_per_s = models.FloatField(null=True)
    container_memory = models.FloatField(null=True)
    gpu_memory = models.FloatField(null=True)
    spec_tokens_per_step = models.FloatField(null=True)
    notes = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["engine", "at"],
                                               name="enginereading_engine_at")]


class EngineRollup(models.Model):
    """Min/mean/max of an engine metric over one bucket: the engine side of :class:`Rollup`."""

    engine = models.ForeignKey(Engine, on_delete=models.CASCADE, related_name="+")
    metric = models.PositiveSmallIntegerField(choices=EngineMetric.choices)
    resolution = models.PositiveIntegerField(default=60)
    start = models.DateTimeField()
    min = models.FloatField()
    max = models.FloatField()
    mean = models.FloatField()
    count = models.PositiveIntegerField()

    class Meta:
        indexes = [models.Index(fields=["engine", "metric", "resolution", "start", "min", "max"],
                                name="erollup_bucket_covering")]


class GpuMetric(models.IntegerChoices):
    """Per-GPU series read through NVML (``collectors.gpus``). Stored ids: never renumber."""

    UTILIZATION = 1, "GPU utilisation (%)"
    TEMPERATURE = 2, "GPU temperature (°C)"
    POWER = 3, "GPU power draw (W)"
    SM_CLOCK = 4, "SM clock (MHz)"


# A GpuSample's note for a figure the GPU cannot report (NVML's NotSupported).
GPU_NOT_SUPPORTED = "not supported"


class GpuSample(models.Model):
    """One NVML figure of one GPU of a node at one read: narrow (node, device, metric, time,
    value), a row per figure, since a GB10 has one GPU and its figures are few; the roll-up tiers
    and chart readers serve it beside the host and engine readings (``collectors.readings``).

    ``value`` is NULL when NVML gave no figure; ``note`` says why, in the words
    ``collectors.gpus.field_reading`` writes ("not supported" when the GPU cannot report it,
    else NVML's error). ``device_uuid`` names the physical GPU behind the index ("" if unknown).
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    device_index = models.PositiveSmallIntegerField()
    device_uuid = models.CharField(max_length=96, blank=True)
    metric = models.PositiveSmallIntegerField(choices=GpuMetric.choices)
    at = models.DateTimeField()
    value = models.FloatField(null=True)
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        indexes = [
            # Chart and prune queries are "node N, metric M, time range".
            models.Index(fields=["node", "metric", "at"], name="gsample_node_metric_at"),
            # The reads that failed in a chart's range, without walking the figures NVML gave
            # or those a GPU never supports (a row per read each).
            models.Index(fields=["node", "at"], name="gsample_failed_node_at",
                         condition=models.Q(value__isnull=True)
                         & ~models.Q(note=GPU_NOT_SUPPORTED)),
        ]


class GpuRollup(models.Model):
    """Min/mean/max of a GPU metric over one bucket: the GPU side of :class:`Rollup`."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    device_index = models.PositiveSmallIntegerField()
    metric = models.PositiveSmallIntegerField(choices=GpuMetric.choices)
    resolution = models.PositiveIntegerField(default=60)
    start = models.DateTimeField()
    min = models.FloatField()
    max = models.FloatField()
    mean = models.FloatField()
    count = models.PositiveIntegerField()

    class Meta:
        # Covering for a chart's read (node, metrics, tier, time range -> device, min, max).
        indexes = [models.Index(fields=["node", "metric", "resolution", "start", "device_index",
                                        "min", "max"], name="grollup_bucket_covering")]


class Event(models.Model):
    """Something that happened on a node: a restart, a phase change, a lost GPU, a failing scrape.

    The timeline marks these; alerts are built on top of them.
    """

    class Severity(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        CRITICAL = "critical"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    engine = models.ForeignKey(Engine, null=True, blank=True, on_delete=models.CASCADE,
                               related_name="events")
    at = models.DateTimeField()
    kind = models.CharField(max_length=64)
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.INFO)
    message = models.TextField()

    class Meta:
        indexes = [models.Index(fields=["node", "at"], name="event_node_at")]
        ordering = ["-at"]


class LedgerChange(models.Model):
    """A ledger component that moved by more than the node's change threshold.

    Components: ``kv_pool`` and ``non_kv`` of an engine (``non_kv`` is all it holds while its
    pool is not reported: ``collectors.ledger._beyond_pool``), ``loaded_models``, ``page_cache``,
    or ``process:<name>``.
    Alert causes are read from these rows ("B's KV pool went 8 → 24 GiB at 14:02").
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="ledger_changes")
    engine = models.ForeignKey(Engine, null=True, blank=True, on_delete=models.CASCADE,
                               related_name="+")
    component = models.CharField(max_length=160)
    label = models.CharField(max_length=255)
    at = models.DateTimeField()
    before_bytes = models.BigIntegerField(null=True)
    after_bytes = models.BigIntegerField(null=True)

    class Meta:
        indexes = [models.Index(fields=["node", "at"], name="ledgerchange_node_at")]
        ordering = ["-at"]

    @property
    def growth_bytes(self) -> int:
        return (self.after_bytes or 0) - (self.before_bytes or 0)


class ModelArchitecture(models.Model):
    """A model's architecture as the KV planner reads it when an engine's own config.json cannot
    be read (collectors.modelarch.seeded_architecture): one row per model, found by its Hugging
    Face repo id or an alias. A row holds either ``config`` (a config.json: the fields
    ``architecture_from_config`` reads, with ``hf_quant_config`` for older ModelOpt exports) or
    ``unknown_reason`` (why the planner cannot size the model), never both, and ``source`` says
    where its figures come from.

    Seeded by a data migration from ``collectors/seeds/model_architectures.json`` and edited
    under Admin → Model architectures; :meth:`clean` refuses a row the planner cannot read, and
    the admin records who changed a row and that it is no longer an untouched seed.
    """

    repo_id = models.CharField(
        "model", max_length=255, unique=True,
        help_text="The Hugging Face repo id, e.g. nvidia/Gemma-4-26B-A4B-NVFP4 (kept in lower "
                  "case).")
    aliases = models.TextField(
        blank=True, help_text="Other names of the same checkpoint, one repo id per line.")
    config = models.JSONField(
        "config.json", null=True, blank=True,
        help_text="The model's config.json as published (at least the fields the planner "
                  "reads). Leave it empty when the model cannot be planned and say why below.")
    hf_quant_config = models.JSONField(
        "hf_quant_config.json", null=True, blank=True,
        help_text="Only for older ModelOpt exports that write it instead of a "
                  "quantization_config.")
    unknown_reason = models.TextField(
        "why it cannot be planned", blank=True,
        help_text="Completes “<model> is …”, e.g. “a hybrid Mamba-2 / attention model …”.")
    source = models.TextField(help_text="Where the figures come from, in words.")
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    changed_at = models.DateTimeField(default=timezone.now)
    # True while the row is as the seed migration wrote it; an admin's save clears it.
    untouched_seed = models.BooleanField(default=False)

    class Meta:
        ordering = ["repo_id"]
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(config__isnull=False, unknown_reason="")
                           | (models.Q(config__isnull=True) & ~models.Q(unknown_reason=""))),
                name="modelarch_config_or_reason",
                violation_error_message="A model architecture holds either a config.json or "
                                        "why it cannot be planned."),
        ]

    def __str__(self) -> str:
        return self.repo_id

    @property
    def alias_list(self) -> list[str]:
        return _repo_ids(self.aliases)

    def clean(self) -> None:
        """Lower-cases the names and refuses a row the planner could not read: each field's
        problem in words (collectors.modelarch.table_entry_problems), and a name another row
        already has."""
        from collectors.modelarch import table_entry_problems

        self.repo_id = self.repo_id.strip().rstrip("/").lower()
        aliases = [alias for alias in self.alias_list if alias != self.repo_id]
        self.aliases = "\n".join(dict.fromkeys(aliases))
        problems = table_entry_problems(self.config, self.hf_quant_config, self.unknown_reason)
        # Every name of every other row (a small table): each name finds one row only.
        taken = {name: row.repo_id for row in ModelArchitecture.objects.exclude(pk=self.pk)
                 for name in [*row.alias_list, row.repo_id]}
        if self.repo_id in taken:
            owner = taken[self.repo_id]
            problems["repo_id"] = (f"{self.repo_id} is already in the table" if owner ==
                                   self.repo_id else f"{self.repo_id} is an alias of {owner}")
        clashes = [f"{alias} (of {taken[alias]})" for alias in aliases if alias in taken]
        if clashes:
            problems["aliases"] = f"already another model's name: {', '.join(clashes)}"
        if problems:
            raise ValidationError(problems)


def _repo_ids(text: str) -> list[str]:
    return [line.strip().rstrip("/").lower() for line in (text or "").splitlines()
            if line.strip()]
