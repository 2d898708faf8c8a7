"""The exports' small world: one node with a collection, a ledger, three engines, alerts and
restarts, every row built explicitly so each exported figure can be asserted exactly."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from collectors.ledger import EngineShare, Ledger
from collectors.models import Collection, Engine, Metric, Node
from collectors.readings import HOST, Sample
from dashboard.alerting.models import Alert, AlertState
from dashboard.restarts.models import Restart

GIB = 1024**3
MIB = 1024**2
TOKEN = "export-token-for-tests-0123456789"


@dataclass
class World:
    node: Node
    gemma: Engine  # ready, scraped a moment ago
    nemotron: Engine  # still loading, never scraped
    qwen: Engine  # running, but its latest scrape failed
    firing: Alert


def collect(node: Node, at: datetime, figures: dict[Metric, tuple[float | None, str]]) -> None:
    """One successful collection at ``at`` with the given samples (value, note)."""
    Collection.objects.create(node=node, at=at, window_started_at=at - timedelta(seconds=4.75),
                              ok=True, reads=48)
    HOST.reading(node, at, [
        Sample(metric, at, value, note) for metric, (value, note) in figures.items()
    ]).save()


HOST_FIGURES: dict[Metric, tuple[float | None, str]] = {
    Metric.MEM_AVAILABLE: (40 * GIB, ""),
    Metric.MEM_AVAILABLE_MIN: (38 * GIB, ""),
    Metric.MEM_FREE: (None, "unreadable value 'n/a'"),
    Metric.PAGE_CACHE_RECLAIMABLE: (10 * GIB, ""),
    Metric.SWAP_USED: (0.0, ""),
    Metric.PSI_SOME_AVG10: (12.5, ""),
    Metric.PSI_FULL_AVG10: (None, "no 'full' line in /proc/pressure/memory"),
}


def _engine(node: Node, name: str, **fields: object) -> Engine:
    return Engine.objects.create(node=node, name=name, container_id=f"{name}-id",
                                 container_state="running", **fields)


def build(node: Node, now: datetime) -> World:
    """Seed the world around ``now`` (the collection ends 1 s before it)."""
    collect(node, now - timedelta(seconds=1), HOST_FIGURES)
    gemma = _engine(
        node, "gemma", phase="ready", image="vllm/vllm-openai:v0.33.0",
        config={"model": "/models/gemma", "served_model_name": "gemma-4-26b", "max_num_seqs": 8},
        startup={"version": "0.33.0", "weights_gib": 15.0},
        metrics={"snapshot": {"model_name": "gemma-4-26b", "requests_running": 3,
                              "requests_waiting": 1, "kv_cache_usage": 0.25}},
        rates={"interval_seconds": 5.0, "restarted": False, "prefill_tokens_per_s": 1500.0,
               "decode_tokens_per_s": 42.5, "ttft_p50_s": 0.25, "ttft_p95_s": 1.5,
               "itl_p50_s": 0.03125, "itl_p95_s": None},
        last_scrape_at=now, last_scrape_ok_at=now,
    )
    nemotron = _engine(node, "nemotron", phase="loading", image="vllm/vllm-openai:v0.33.0",
                       config={"model": "nvidia/Nemotron-Nano"})
    qwen = _engine(
        node, "qwen", phase="ready", image="vllm/vllm-openai:v0.10.2",
        config={"model": "Qwen/Qwen3-8B", "max_num_seqs": 4},
        # What the last good scrape said: no longer true, so never exported.
        metrics={"snapshot": {"requests_running": 5, "kv_cache_usage": 0.5}},
        rates={"decode_tokens_per_s": 10.0},
        last_scrape_at=now, last_scrape_ok_at=now - timedelta(minutes=2),
        last_scrape_error="connection refused",
    )
    node.ledger = Ledger(
        at=(now - timedelta(seconds=1)).isoformat(),
        mem_total=node.mem_total_bytes, mem_available=40 * GIB, mem_available_min=38 * GIB,
        page_cache_reclaimable=10 * GIB, swap_used=0,
        engines=[
            EngineShare(engine_id=gemma.pk, name="gemma", weights=15 * GIB, kv_pool=8 * GIB,
                        cuda_graphs=512 * MIB, actual=24 * GIB, prefill_estimate=2 * GIB,
                        prefill_observed=3 * GIB, prefill_need=3 * GIB,
                        prefill_need_source="observed"),
            EngineShare(engine_id=nemotron.pk, name="nemotron", weights=20 * GIB, kv_pool=None,
                        cuda_graphs=None, actual=None, prefill_estimate=None,
                        prefill_observed=None, prefill_need=None, prefill_need_source=None),
        ],
        processes=[{"name": "python3", "rss_bytes": 2 * GIB, "count": 2}],
        others_total=2 * GIB,
    ).as_dict()
    node.save(update_fields=["ledger"])

    firing = _alert(node, gemma, "prefill-squeeze", AlertState.FIRING, "critical",
                    now - timedelta(seconds=60), cause="qwen's KV pool went 8 → 24 GiB at 14:02")
    _alert(node, None, "headroom-floor", AlertState.PENDING, "critical",
           now - timedelta(seconds=20))
    _alert(node, qwen, "engine-down", AlertState.RESOLVED, "warning",
           now - timedelta(hours=2))
    _alert(node, None, "overcommit", AlertState.RESOLVED, "warning", now - timedelta(hours=3))

    Restart.objects.create(node=node, engine=gemma, kind=Restart.Kind.PLANNED,
                           status=Restart.Status.SUCCEEDED, reason="new weights",
                           requested_at=now - timedelta(days=1),
                           started_at=now - timedelta(days=1),
                           finished_at=now - timedelta(days=1) + timedelta(minutes=9),
                           startup_seconds=512.5)
    Restart.objects.create(node=node, engine=gemma, kind=Restart.Kind.UNPLANNED,
                           status=Restart.Status.DETECTED, requested_at=now - timedelta(hours=5))
    Restart.objects.create(node=node, engine=qwen, kind=Restart.Kind.PLANNED,
                           status=Restart.Status.FAILED, requested_at=now - timedelta(hours=6),
                           outcome="not ready by the deadline")
    return World(node=node, gemma=gemma, nemotron=nemotron, qwen=qwen, firing=firing)


def _alert(node: Node, engine: Engine | None, rule: str, state: str, severity: str,
           started_at: datetime, cause: str = "") -> Alert:
    resolved = state == AlertState.RESOLVED
    return Alert.objects.create(
        rule=rule, node=node, engine=engine,
        scope=f"{rule}:{node.pk}:{engine.pk if engine else '-'}", state=state,
        severity=severity, summary=f"{rule} on {engine.name if engine else node.name}",
        details={"cause": cause} if cause else {}, value=1.5, threshold=2.0,
        direction="below", started_at=started_at,
        fired_at=started_at + timedelta(seconds=10) if state != AlertState.PENDING else None,
        resolved_at=started_at + timedelta(minutes=5) if resolved else None,
        last_evaluated_at=started_at + timedelta(minutes=5),
    )
