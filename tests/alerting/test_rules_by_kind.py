"""The alert rules on engines of every kind: each says what it reads in that kind's words, and a
figure the kind cannot report makes the rule's value unknown, with the kind's reason — never a
firing alert, never a silent "all is well" read from a 0."""

from datetime import UTC, datetime, timedelta

import pytest

from collectors.kinds.registry import READERS
from collectors.ledger import build_ledger, record_changes
from collectors.models import Engine, EngineMetric
from dashboard.alerting.rules import engine_down, overcommit, prefill_stall, queue_backlog
from dashboard.alerting.settings import rule_settings
from sparkops.units import GIB
from tests.stored import engine_sample

T0 = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
FIGURES = {"mem_total": int(121.69 * GIB), "mem_available": 30 * GIB,
           "mem_available_min": 29 * GIB, "page_cache_reclaimable": 2 * GIB, "swap_used": 0}


def _engine(node, name: str, kind: str, **extra) -> Engine:
    """An engine of ``kind`` as the collector stores it: the kind's never-reported parts are
    in ``metrics["unknown"]`` with their reasons."""
    metrics = {"snapshot": {}, "details": {}, "unknown": dict(READERS[kind].never_reported),
               **extra.pop("metrics", {})}
    values = dict(node=node, name=name, kind=kind, container_id=name * 8,
                  container_state="running", phase="ready", metrics=metrics)
    values.update(extra)
    return Engine.objects.create(**values)


def _thresholds(rule: str) -> dict:
    return dict(rule_settings(rule).thresholds)


def _waiting(engine: Engine, *values: float) -> None:
    for i, value in enumerate(values):
        engine_sample(engine, EngineMetric.REQUESTS_WAITING, T0 - timedelta(seconds=5 * i), value)


@pytest.mark.parametrize(("kind", "reason"), [
    ("vllm", "/metrics: connection refused"),
    ("llamacpp", "llama-server API: connection refused"),
    ("ollama", "Ollama API: connection refused"),
])
def test_engine_down_names_what_the_kind_is_read_from(node, kind, reason):
    engine = _engine(node, "e", kind, last_scrape_error="connection refused")

    cond = engine_down.evaluate(node, {}, [engine], {}, T0)[0]

    assert cond.details["reason"] == reason and cond.summary == f"e is down: {reason}"
    assert cond.crosses_threshold()


def test_queue_backlog_on_ollama_is_unknown_with_the_reason(node):
    chat = _engine(node, "chat", "ollama", config={"max_num_seqs": 1})

    cond = queue_backlog.evaluate(node, {}, [chat], _thresholds("queue-backlog"), T0)[0]

    assert cond.value is None and cond.crosses_threshold() is None
    assert cond.summary == ("chat: how long requests wait is unknown — Ollama reports no "
                            "running or waiting requests")
    assert "vLLM" not in cond.summary and "max_num_seqs" not in cond.details


def test_queue_backlog_on_llamacpp_counts_its_deferred_requests_against_its_slots(node):
    qwen = _engine(node, "qwen", "llamacpp", config={"max_num_seqs": None},
                   metrics={"details": {"props": {"total_slots": 4}}})
    _waiting(qwen, 2, 2, 1, 1, 1, 0)  # deferred for 20 s

    cond = queue_backlog.evaluate(node, {}, [qwen], _thresholds("queue-backlog"), T0)[0]

    assert cond.value == 20.0 and cond.crosses_threshold()
    assert "(slots: 4)" in cond.summary and cond.details["slots"] == 4
    unsized = _engine(node, "bare", "llamacpp")
    _waiting(unsized, 1)
    cond = queue_backlog.evaluate(node, {}, [unsized], _thresholds("queue-backlog"), T0)[0]
    assert "(slots: unknown)" in cond.summary  # not "vLLM default"


@pytest.mark.parametrize(("kind", "unknown", "reason"), [
    ("ollama", {}, "Ollama has no /metrics: it keeps no token counters"),
    ("llamacpp", {"rates": "llama-server runs without --metrics: it keeps no token counters, "
                           "so no prefill or decode rates"},
     "llama-server runs without --metrics"),
])
def test_prefill_stall_without_token_counters_is_unknown_not_calm(node, kind, unknown, reason):
    engine = _engine(node, "e", kind, metrics={"unknown": {**READERS[kind].never_reported,
                                                           **unknown}})

    cond = prefill_stall.evaluate(node, {}, [engine], _thresholds("prefill-stall"), T0)[0]

    assert cond.value is None
    assert cond.summary.startswith(f"e: whether a prefill stalls decode is unknown — {reason}")
    assert cond.details["unknown_because"].startswith(reason)


def test_overcommit_counts_ollamas_loaded_models_and_llamacpps_known_parts(node):
    chat = _engine(node, "chat", "ollama", metrics={"details": {
        "models": [{"name": "gpt-oss:120b", "size_bytes": 64 * GIB}], "size_bytes": 64 * GIB}})
    qwen = _engine(node, "qwen", "llamacpp",
                   startup={"phase": "ready", "weights_gib": 40.0, "kv_cache_gib": 24.0})
    ledger = build_ledger(node, T0, FIGURES, [chat, qwen], [])
    record_changes(node, ledger, T0)
    node.refresh_from_db()

    cond = overcommit.evaluate(node, node.ledger, [chat, qwen], _thresholds("overcommit"),
                               T0)[0]

    # 64 GiB of loaded models + 64 GiB of llama.cpp's weights and KV pool, CUDA graphs not
    # logged: already past 121.69 GiB, so certain.
    assert cond.details["reserved_bytes"] == 128 * GIB
    assert cond.details["unknown"] == ["qwen (its CUDA graphs)"]
    assert cond.value == pytest.approx(128 - 121.69, abs=0.01) and cond.crosses_threshold()
