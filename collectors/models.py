"""Nodes and the narrow time-series tables their samples live in.

Every sample belongs to a node, so one central SparkOps can watch a fleet of GB10s.
``Sample`` is narrow (node, metric, time, value): adding a metric is a new enum member, not a
migration, and each chart query reads one (node, metric, time-range) slice of one index.
"""

from __future__ import annotations

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


class Collection(models.Model):
    """One attempt to collect a node's host memory; a failed one is a gap with its reason."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="collections")
    at = models.DateTimeField()
    window_started_at = models.DateTimeField()
    reads = models.PositiveIntegerField(default=0)
    ok = models.BooleanField()
    error = models.TextField(blank=True)

    class Meta:
        # Serves "latest collection of node N" and "failures of node N in a range".
        indexes = [models.Index(fields=["node", "at"], name="collection_node_at")]
        ordering = ["-at"]


class Sample(models.Model):
    """One value of one metric of one node at one instant.

    ``value`` is NULL when the figure was unknown at that instant; ``note`` says why.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    metric = models.PositiveSmallIntegerField(choices=Metric.choices)
    at = models.DateTimeField()
    value = models.FloatField(null=True)
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        # Every chart and prune query is "node N, metric M, time range".
        indexes = [models.Index(fields=["node", "metric", "at"], name="sample_node_metric_at")]


class Rollup(models.Model):
    """Per-minute min/mean/max of a metric, kept much longer than raw samples."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    metric = models.PositiveSmallIntegerField(choices=Metric.choices)
    minute = models.DateTimeField()
    min = models.FloatField()
    max = models.FloatField()
    mean = models.FloatField()
    count = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "metric", "minute"], name="rollup_unique_minute")
        ]
