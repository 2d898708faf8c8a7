"""``/metrics``: exact figures from explicitly seeded rows, unknowns omitted, and promtool's
verdict on the real output."""

from __future__ import annotations

import shutil
import subprocess
from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.models import Collection, Node
from dashboard.alerting.models import Alert, AlertState
from tests.exports.world import GIB, MIB, World

PROMTOOL = "/usr/bin/promtool"
GEMMA = {"node": "spark-a", "engine": "gemma", "model": "gemma-4-26b"}
NEMOTRON = {"node": "spark-a", "engine": "nemotron", "model": "nvidia/Nemotron-Nano"}
QWEN = {"node": "spark-a", "engine": "qwen", "model": "Qwen/Qwen3-8B"}
NODE = {"node": "spark-a"}

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client, bearer) -> str:
    response = client.get("/metrics", headers=bearer)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return response.content.decode()


def series(text: str) -> Series:
    """Every sample of the exposition, parsed by the reference parser, keyed by name+labels."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(parsed: Series, name: str, **labels: str) -> float | None:
    return parsed.get((name, frozenset(labels.items())))


def names(parsed: Series) -> set[str]:
    return {name for name, _ in parsed}


def promtool() -> str:
    if not shutil.which(PROMTOOL):
        pytest.fail(f"{PROMTOOL} is missing: install the Debian package 'prometheus' "
                    "(apt-get install prometheus); the exports are checked with its promtool")
    return PROMTOOL


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30)


def test_host_memory_figures_in_base_units(client, bearer, world: World):
    parsed = series(scrape(client, bearer))

    assert value(parsed, "sparkops_mem_total_bytes", **NODE) == world.node.mem_total_bytes
    assert value(parsed, "sparkops_mem_available_bytes", **NODE) == 40 * GIB
    assert value(parsed, "sparkops_mem_available_interval_min_bytes", **NODE) == 38 * GIB
    assert value(parsed, "sparkops_headroom_bytes", **NODE) == 38 * GIB
    assert value(parsed, "sparkops_page_cache_reclaimable_bytes", **NODE) == 10 * GIB
    assert value(parsed, "sparkops_swap_used_bytes", **NODE) == 0  # known to be none
    assert value(parsed, "sparkops_psi_some_avg10_ratio", **NODE) == 0.125  # 12.5 %
    assert value(parsed, "sparkops_collection_ok", **NODE) == 1
    assert 1 <= value(parsed, "sparkops_collection_age_seconds", **NODE) < 60


def test_unknown_host_figures_are_omitted_not_zero(client, bearer, world: World):
    text = scrape(client, bearer)

    # MemFree was unreadable and PSI had no "full" line in the seeded collection.
    assert "sparkops_mem_free_bytes" not in text
    assert "sparkops_psi_full_avg10_ratio" not in text


def test_a_failed_latest_collection_withholds_every_host_figure(client, bearer, world: World,
                                                                now):
    Collection.objects.create(node=world.node, at=now, window_started_at=now - timedelta(seconds=5),
                              ok=False, error="cannot read /proc/meminfo")

    parsed = series(scrape(client, bearer))

    assert value(parsed, "sparkops_collection_ok", **NODE) == 0
    assert value(parsed, "sparkops_collection_age_seconds", **NODE) is not None
    assert value(parsed, "sparkops_mem_total_bytes", **NODE) == world.node.mem_total_bytes
    for name in ("sparkops_mem_available_bytes", "sparkops_headroom_bytes",
                 "sparkops_page_cache_reclaimable_bytes", "sparkops_swap_used_bytes",
                 "sparkops_psi_some_avg10_ratio"):
        assert name not in names(parsed), name


def test_a_stale_collection_withholds_host_figures_but_says_how_old(client, bearer, world: World,
                                                                    settings):
    settings.SPARKOPS_COLLECT_INTERVAL = 1.0
    Collection.objects.update(at=Collection.objects.get().at - timedelta(minutes=10))

    parsed = series(scrape(client, bearer))

    assert "sparkops_mem_available_bytes" not in names(parsed)
    assert value(parsed, "sparkops_collection_age_seconds", **NODE) >= 600
    assert value(parsed, "sparkops_collection_ok", **NODE) == 1


def test_the_ledger_per_engine(client, bearer, world: World):
    parsed = series(scrape(client, bearer))

    assert value(parsed, "sparkops_ledger_weights_bytes", **GEMMA) == 15 * GIB
    assert value(parsed, "sparkops_ledger_kv_pool_bytes", **GEMMA) == 8 * GIB
    assert value(parsed, "sparkops_ledger_cuda_graphs_bytes", **GEMMA) == 512 * MIB
    assert value(parsed, "sparkops_ledger_reserved_bytes", **GEMMA) == 23 * GIB + 512 * MIB
    assert value(parsed, "sparkops_ledger_prefill_need_bytes", **GEMMA,
                 source="observed") == 3 * GIB
    assert value(parsed, "sparkops_ledger_others_bytes", **NODE) == 2 * GIB
    assert value(parsed, "sparkops_ledger_age_seconds", **NODE) is not None
    # Nemotron reported its weights only: the rest is unknown, so absent (never 0).
    assert value(parsed, "sparkops_ledger_weights_bytes", **NEMOTRON) == 20 * GIB
    for name in ("sparkops_ledger_kv_pool_bytes", "sparkops_ledger_cuda_graphs_bytes",
                 "sparkops_ledger_reserved_bytes", "sparkops_ledger_prefill_need_bytes"):
        assert not [key for key in parsed if key[0] == name
                    and ("engine", "nemotron") in key[1]], name


def test_engine_phase_is_one_series_per_phase(client, bearer, world: World):
    text = scrape(client, bearer)
    parsed = series(text)

    phases = {dict(labels)["phase"]: sample for (name, labels), sample in parsed.items()
              if name == "sparkops_engine_phase" and dict(labels)["engine"] == "nemotron"}
    assert phases["loading"] == 1
    assert sum(phases.values()) == 1
    assert {"starting", "ready", "failed", "stopped"} <= set(phases)
    assert ('sparkops_engine_phase{engine="gemma",model="gemma-4-26b",node="spark-a",'
            'phase="ready"} 1.0') in text.splitlines()


def test_an_unexpected_phase_is_still_exported(client, bearer, world: World):
    world.gemma.phase = "sleeping"
    world.gemma.save()

    parsed = series(scrape(client, bearer))

    assert value(parsed, "sparkops_engine_phase", **GEMMA, phase="sleeping") == 1
    assert value(parsed, "sparkops_engine_phase", **GEMMA, phase="ready") == 0


def test_engine_info_and_serving_figures(client, bearer, world: World):
    parsed = series(scrape(client, bearer))

    assert value(parsed, "sparkops_engine_info", **GEMMA, image="vllm/vllm-openai:v0.33.0",
                 version="0.33.0", kind="vllm") == 1
    assert value(parsed, "sparkops_engine_scrape_up", **GEMMA) == 1
    assert value(parsed, "sparkops_engine_max_num_seqs", **GEMMA) == 8
    assert value(parsed, "sparkops_engine_requests_running", **GEMMA) == 3
    assert value(parsed, "sparkops_engine_requests_waiting", **GEMMA) == 1
    assert value(parsed, "sparkops_engine_kv_cache_usage_ratio", **GEMMA) == 0.25
    assert value(parsed, "sparkops_engine_prefill_tokens_per_second", **GEMMA) == 1500
    assert value(parsed, "sparkops_engine_decode_tokens_per_second", **GEMMA) == 42.5
    assert value(parsed, "sparkops_engine_ttft_p50_seconds", **GEMMA) == 0.25
    assert value(parsed, "sparkops_engine_ttft_p95_seconds", **GEMMA) == 1.5
    assert value(parsed, "sparkops_engine_itl_p50_seconds", **GEMMA) == 0.03125
    # Nothing was observed for the p95 in that interval.
    assert value(parsed, "sparkops_engine_itl_p95_seconds", **GEMMA) is None


def test_an_engine_that_does_not_answer_exports_no_stale_serving_figures(client, bearer,
                                                                         world: World):
    parsed = series(scrape(client, bearer))

    # qwen's latest scrape failed: up is 0 and its last good figures are not passed off as now.
    assert value(parsed, "sparkops_engine_scrape_up", **QWEN) == 0
    assert value(parsed, "sparkops_engine_max_num_seqs", **QWEN) == 4  # a launch flag: known
    serving = [key for key in parsed if key[0].startswith("sparkops_engine_")
               and key[0] not in ("sparkops_engine_info", "sparkops_engine_phase",
                                  "sparkops_engine_scrape_up", "sparkops_engine_max_num_seqs",
                                  "sparkops_engine_restarts")]
    assert not [key for key in serving if ("engine", "qwen") in key[1]]
    # nemotron was never scraped: no up series at all, and no serving figures.
    assert not [key for key in parsed if key[0] != "sparkops_engine_restarts"
                and key[0].startswith("sparkops_engine_") and ("engine", "nemotron") in key[1]
                and key[0] not in ("sparkops_engine_info", "sparkops_engine_phase")]


def test_a_stopped_engine_is_not_up(client, bearer, world: World):
    world.gemma.container_state = "exited"
    world.gemma.phase = "stopped"
    world.gemma.save()

    parsed = series(scrape(client, bearer))

    assert value(parsed, "sparkops_engine_scrape_up", **GEMMA) == 0
    assert value(parsed, "sparkops_engine_decode_tokens_per_second", **GEMMA) is None


def test_an_interval_with_a_restart_has_no_rates_rather_than_zero(client, bearer, world: World):
    world.gemma.rates = {"interval_seconds": 5.0, "restarted": True,
                         "reason": "process_start_time_seconds changed",
                         "prefill_tokens_per_s": None, "decode_tokens_per_s": None}
    world.gemma.save()

    parsed = series(scrape(client, bearer))

    assert value(parsed, "sparkops_engine_decode_tokens_per_second", **GEMMA) is None
    assert value(parsed, "sparkops_engine_prefill_tokens_per_second", **GEMMA) is None
    assert value(parsed, "sparkops_engine_requests_running", **GEMMA) == 3  # a gauge: still known


def test_alert_states(client, bearer, world: World):
    text = scrape(client, bearer)
    parsed = series(text)

    firing = {key: sample for key, sample in parsed.items() if key[0] == "sparkops_alert_firing"}
    assert firing == {("sparkops_alert_firing", frozenset({
        "rule": "prefill-squeeze", "node": "spark-a", "engine": "gemma", "severity": "critical",
    }.items())): 1.0}
    assert value(parsed, "sparkops_alerts", node="spark-a", state="firing") == 1
    assert value(parsed, "sparkops_alerts", node="spark-a", state="pending") == 1
    assert value(parsed, "sparkops_alerts", node="spark-a", state="resolved") == 2


def test_a_node_wide_firing_alert_has_an_empty_engine(client, bearer, world: World):
    Alert.objects.filter(rule="headroom-floor").update(state=AlertState.FIRING,
                                                       fired_at=world.firing.fired_at)

    text = scrape(client, bearer)

    assert ('sparkops_alert_firing{engine="",node="spark-a",rule="headroom-floor",'
            'severity="critical"} 1.0') in text.splitlines()


def test_two_firing_alerts_of_deleted_engines_make_one_series(client, bearer, world: World, now):
    for engine in (world.nemotron, world.qwen):
        Alert.objects.create(rule="engine-down", node=world.node, engine=engine,
                             scope=f"engine-down:{world.node.pk}:{engine.pk}",
                             state=AlertState.FIRING, severity="critical", summary="down",
                             threshold=1, started_at=now, fired_at=now, last_evaluated_at=now)
    world.nemotron.delete()
    world.qwen.delete()

    text = scrape(client, bearer)

    prefix = 'sparkops_alert_firing{engine="",node="spark-a",rule="engine-down"'
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1
    assert promtool_check(text).returncode == 0


def test_restart_counts_by_kind_and_status(client, bearer, world: World):
    parsed = series(scrape(client, bearer))

    def restarts(engine: str, kind: str, status: str) -> float | None:
        return value(parsed, "sparkops_engine_restarts", node="spark-a", engine=engine,
                     kind=kind, status=status)

    assert restarts("gemma", "planned", "succeeded") == 1
    assert restarts("gemma", "unplanned", "detected") == 1
    assert restarts("qwen", "planned", "failed") == 1
    assert restarts("qwen", "planned", "succeeded") == 0
    assert restarts("nemotron", "unplanned", "detected") == 0


def test_a_node_before_its_first_collection(client, bearer, db):
    Node.objects.create(name="spark-b", mem_total_bytes=None)

    text = scrape(client, bearer)
    parsed = series(text)

    # Nothing is known about spark-b yet but its alert counts (none).
    assert {name for name, labels in parsed if ("node", "spark-b") in labels} == {
        "sparkops_alerts"}
    assert promtool_check(text).returncode == 0


def test_promtool_accepts_the_real_output(client, bearer, world: World):
    text = scrape(client, bearer)

    result = promtool_check(text)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


def test_promtool_is_really_checking():
    # The check above would pass vacuously if promtool accepted anything.
    result = promtool_check("# HELP sparkops_things_total Things.\n"
                            "# TYPE sparkops_things_total gauge\n"
                            'sparkops_things_total{quantile="0.5"} 1\n')

    assert result.returncode != 0
