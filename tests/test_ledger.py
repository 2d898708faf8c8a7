"""The memory ledger: engine shares, change rows (alert causes), learned prefill needs, the bar."""

from datetime import UTC, datetime, timedelta

import pytest

from collectors.ledger import (
    budget_components,
    build_ledger,
    engine_share,
    prefill_estimate,
    record_changes,
    record_prefill_observation,
    update_ledger,
)
from collectors.modelconfig import activation_bytes_per_token, read_model_config
from collectors.models import Engine, LedgerChange
from collectors.processes import ProcessGroup, memory_by_process_name
from dashboard.ledger import ledger_bar

GIB = 1024**3
MIB = 1024**2
T0 = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)


def _engine(node, name, kv_gib, **extra):
    values = dict(
        node=node, name=name, container_id=name * 8, container_state="running", phase="ready",
        startup={"weights_gib": 15.5, "kv_cache_gib": kv_gib, "cuda_graph_gib": -1.2},
        config={"max_num_batched_tokens": 8192},
    )
    values.update(extra)
    return Engine.objects.create(**values)


FIGURES = {"mem_total": int(121.69 * GIB), "mem_available": 30 * GIB,
           "mem_available_min": 27 * GIB, "page_cache_reclaimable": 6 * GIB, "swap_used": 0}


def test_engine_share_reads_parts_and_clamps_negative_graph_memory(node):
    engine = _engine(node, "gemma", 8.0, labels={"sparkops.prefill-bytes-per-token": "131072"})

    share = engine_share(engine)

    assert share.weights == int(15.5 * GIB) and share.kv_pool == 8 * GIB
    assert share.cuda_graphs == 0  # GB10's negative estimate holds nothing
    assert share.reserved == int(15.5 * GIB) + 8 * GIB
    assert share.prefill_estimate == 8192 * 131072  # 1 GiB
    assert (share.prefill_need, share.prefill_need_source) == (GIB, "estimate")


def test_observed_need_wins_when_larger_and_unknown_stays_unknown(node):
    engine = _engine(node, "gemma", 8.0, prefill_bytes_per_token=65536,
                     prefill_observed_bytes=3 * GIB)
    bare = _engine(node, "bare", None, startup={})

    assert engine_share(engine).prefill_need_source == "observed"
    assert engine_share(engine).prefill_need == 3 * GIB
    share = engine_share(bare)
    assert share.kv_pool is None and share.reserved is None and share.prefill_need is None


def test_a_neighbour_restarting_with_a_bigger_pool_is_recorded_as_a_change(node):
    a, b = _engine(node, "a", 8.0), _engine(node, "b", 8.0)
    record_changes(node, build_ledger(node, T0, FIGURES, [a, b], []), T0)
    b.startup = {**b.startup, "kv_cache_gib": 24.0}
    b.save()

    later = T0 + timedelta(minutes=2)
    changes = record_changes(node, build_ledger(node, later, FIGURES, [a, b], []), later)

    assert [(c.label, c.before_bytes, c.after_bytes) for c in changes] == [
        ("b's KV pool", 8 * GIB, 24 * GIB)
    ]
    assert LedgerChange.objects.filter(node=node, engine=b).count() == 2  # appeared, then grew
    node.refresh_from_db()
    assert node.ledger["engines"][1]["kv_pool"] == 24 * GIB


def test_a_neighbour_loading_before_its_pool_is_reported_is_a_change_and_nets_out_later(node):
    from dashboard.alerting.rules.prefill_squeeze import causes

    victim, b = _engine(node, "a", 8.0), _engine(node, "b", 8.0, memory_usage_bytes=9 * GIB)
    record_changes(node, build_ledger(node, T0, FIGURES, [victim, b], []), T0)
    # b is recreated: still loading, its new pool not reported, its cgroup already 25 GiB.
    b.phase, b.startup, b.memory_usage_bytes = "loading", {}, 25 * GIB
    b.save()
    loading = T0 + timedelta(minutes=1)
    changes = record_changes(node, build_ledger(node, loading, FIGURES, [victim, b], []),
                             loading)

    assert [(c.label, c.before_bytes, c.after_bytes) for c in changes] == [
        ("b's memory (KV pool not reported)", 1 * GIB, 25 * GIB)]
    assert causes(node, victim, loading, 30)[0]["growth_bytes"] == 24 * GIB

    # Its pool is reported: the memory beyond it falls back, the pool grew; over the look-back
    # the cause is the pool alone.
    b.phase, b.startup = "ready", {"weights_gib": 15.5, "kv_cache_gib": 24.0}
    b.save()
    ready = T0 + timedelta(minutes=2)
    record_changes(node, build_ledger(node, ready, FIGURES, [victim, b], []), ready)

    found = causes(node, victim, ready, 30)
    assert [(c["label"], c["before_bytes"], c["after_bytes"]) for c in found] == [
        ("b's KV pool", 8 * GIB, 24 * GIB)]


def test_small_moves_are_not_changes(node, settings):
    settings.SPARKOPS_LEDGER_CHANGE_FRACTION = 0.005  # 0.6 GiB on 121.69 GiB
    processes = [ProcessGroup("postgres", 2 * GIB, 4)]
    record_changes(node, build_ledger(node, T0, FIGURES, [], processes), T0)
    processes = [ProcessGroup("postgres", 2 * GIB + 300 * MIB, 4)]

    assert record_changes(node, build_ledger(node, T0, FIGURES, [], processes), T0) == []


def test_only_a_transient_dip_while_one_engine_prefilled_is_learned(node):
    a = _engine(node, "a", 8.0, rates={"prefill_tokens_per_s": 1800.0})
    b = _engine(node, "b", 8.0, rates={"prefill_tokens_per_s": 0.0})

    # MemAvailable 30 GiB before, 30 at the end, 28.5 at the lowest: a 1.5 GiB buffer.
    assert record_prefill_observation([a, b], 30 * GIB, 30 * GIB, int(28.5 * GIB), T0) == a
    # A lasting drop (a neighbour grew) is not a prefill buffer.
    assert record_prefill_observation([a, b], 30 * GIB, 14 * GIB, 14 * GIB, T0) is None
    a.refresh_from_db()
    assert a.prefill_observed_bytes == int(1.5 * GIB)
    b.rates = {"prefill_tokens_per_s": 10.0}
    b.save()
    assert record_prefill_observation([a, b], 30 * GIB, 30 * GIB, 20 * GIB, T0) is None


def test_model_config_estimates_activation_per_token(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"text_config": {"hidden_size": 2816, "moe_intermediate_size": 704,'
        ' "num_experts_per_tok": 8}}'
    )
    config = read_model_config(tmp_path)

    assert activation_bytes_per_token(config) == (4 * 2816 + 2 * 704 * 8) * 2
    assert activation_bytes_per_token({"hidden_size": 4096, "intermediate_size": 14336}) == \
        (4 * 4096 + 2 * 14336) * 2
    assert activation_bytes_per_token({"hidden_size": "big"}) is None
    assert read_model_config(tmp_path / "missing") is None


def test_prefill_estimate_uses_vllm_default_batch_when_flag_unset(node):
    engine = _engine(node, "a", 8.0, config={}, model_bytes_per_token=1000)
    assert prefill_estimate(engine) == 2048 * 1000


def test_ledger_bar_segments_and_need_markers(node):
    a = _engine(node, "a", 8.0, prefill_bytes_per_token=131072)
    record_changes(node, build_ledger(node, T0, FIGURES, [a],
                                      [ProcessGroup("postgres", 2 * GIB, 1)]), T0)
    node.refresh_from_db()

    bar = ledger_bar(node)

    kinds = [s["kind"] for s in bar["segments"]]
    assert kinds[:3] == ["engine-0", "engine-1", "others"]
    assert kinds[-2:] == ["cache", "free"]
    assert sum(s["pct"] for s in bar["segments"]) == pytest.approx(100, abs=0.1)
    assert bar["markers"][0]["engine"] == "a" and bar["markers"][0]["gib"] == 1.0
    assert bar["headroom_gib"] == 27.0


def test_update_ledger_on_this_machine_names_real_processes(node):
    ledger = update_ledger(node, FIGURES, T0)

    assert ledger.processes and ledger.others_total > 0
    assert ledger.processes[0]["rss_bytes"] >= ledger.processes[-1]["rss_bytes"]
    assert memory_by_process_name()[0].rss_bytes > 0


# --- an engine that loads whole models on demand (Ollama) ----------------------------------------

def _ollama(node, name, *models: tuple[str, int], **extra):
    """An Ollama engine as its reader stores it: ``/api/ps``'s models under ``details``."""
    listed = [{"name": model, "size_bytes": size, "size_vram_bytes": size}
              for model, size in models]
    values = dict(
        node=node, name=name, kind="ollama", container_id=name * 8, container_state="running",
        phase="ready", startup={"phase": "ready", "version": "0.33.0"},
        config={"max_num_batched_tokens": 512},
        metrics={"snapshot": {"model_name": models[0][0] if models else None},
                 "details": {"version": "0.33.0", "models": listed,
                             "size_bytes": sum(size for _, size in models),
                             "size_vram_bytes": sum(size for _, size in models)}},
    )
    values.update(extra)
    return Engine.objects.create(**values)


def test_what_an_ollama_server_loads_is_a_ledger_change_named_for_its_models(node):
    vllm, chat = _engine(node, "gemma", 8.0), _ollama(node, "chat")
    record_changes(node, build_ledger(node, T0, FIGURES, [vllm, chat], []), T0)
    assert engine_share(chat).loaded_models == 0 and engine_share(vllm).loaded_models is None

    chat.metrics = _ollama(node, "x", ("qwen3:30b", 19 * GIB)).metrics
    chat.save()
    later = T0 + timedelta(minutes=1)
    loaded = record_changes(node, build_ledger(node, later, FIGURES, [vllm, chat], []), later)

    assert [(c.component, c.label, c.before_bytes, c.after_bytes) for c in loaded] == [
        (f"engine:{chat.pk}:loaded_models", "chat's loaded models (qwen3:30b)", 0, 19 * GIB)]
    node.refresh_from_db()
    share = node.ledger["engines"][1]
    assert share["loaded_models"] == 19 * GIB and share["loaded_model_names"] == ["qwen3:30b"]
    assert share["kv_pool"] is None and share["weights"] is None  # still not reported apart

    chat.metrics = _ollama(node, "y").metrics  # its keep-alive ran out: unloaded
    chat.save()
    end = later + timedelta(minutes=5)
    unloaded = record_changes(node, build_ledger(node, end, FIGURES, [vllm, chat], []), end)
    assert [(c.label, c.before_bytes, c.after_bytes) for c in unloaded] == [
        ("chat's loaded models (none loaded)", 19 * GIB, 0)]


def test_a_stopped_ollama_holds_no_model_and_a_failed_read_holds_unknown(node):
    loaded = _ollama(node, "chat", ("qwen3:8b", 7 * GIB), ("gpt-oss:20b", 13 * GIB))
    assert engine_share(loaded).loaded_models == 20 * GIB
    assert engine_share(loaded).loaded_model_names == ["qwen3:8b", "gpt-oss:20b"]

    loaded.last_scrape_error = "GET /api/ps: timed out"
    assert engine_share(loaded).loaded_models is None  # what it holds now is not known
    loaded.container_state = "exited"
    assert engine_share(loaded).loaded_models == 0  # a stopped server frees its models


def test_an_ollama_server_appearing_with_a_model_loaded_took_that_room(node):
    chat = _ollama(node, "chat", ("qwen3:8b", 7 * GIB))

    changes = record_changes(node, build_ledger(node, T0, FIGURES, [chat], []), T0)

    assert [(c.label, c.before_bytes, c.after_bytes) for c in changes] == [
        ("chat's loaded models (qwen3:8b)", None, 7 * GIB)]


def test_inside_a_memory_budget_an_ollama_servers_models_can_be_the_cause(node):
    ledger = {"headroom_source": "budget", "engines": [
        {"engine_id": 1, "in_budget": True, "loaded_models": 7 * GIB},
        {"engine_id": 2, "in_budget": True, "loaded_models": None},
        {"engine_id": 3, "in_budget": False, "loaded_models": 5 * GIB}]}

    assert budget_components(ledger) == {
        "engine:1:kv_pool", "engine:1:non_kv", "engine:1:loaded_models",
        "engine:2:kv_pool", "engine:2:non_kv"}
