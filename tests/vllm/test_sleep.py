"""vLLM's sleep mode: read from the log and from ``vllm:engine_sleep_state``, turned into a phase,
and counted in the ledger for what a sleeping engine really still holds.

The line texts and the metric's labels are those of vLLM 0.33's source (every release's are
checked in tests/test_vllm_releases.py against its own fixture): "Sleep mode freed %s GiB memory,
%s GiB memory is still in use." (vllm/v1/worker/gpu_worker.py:335), "It took %.6f seconds to fall
asleep." and "… to wake up tags %s." (vllm/v1/executor/abstract.py:408, 426), and the gauge set
by ``record_sleep_state`` (vllm/v1/metrics/loggers.py:1335).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from collectors.enginecard import engine_card
from collectors.ledger import build_ledger, engine_share
from collectors.models import Engine
from collectors.vllm.logs import PHASES, parse_startup_log
from collectors.vllm.metrics import MetricsParseError, parse_engines
from collectors.vllm.sleep import WEIGHTS_OFFLOADED, phase_with_sleep
from dashboard.alerting.rules import engine_down
from dashboard.engines import humanise_ledger
from dashboard.ledger import ledger_bar

GIB = 1024**3
MIB = 1024**2
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
API = "(APIServer pid=1) INFO 12-01 09:00:00 [entry.py:139]"
CORE = "(EngineCore pid=212) INFO 12-01 09:05:00"
READY = f"{API} Starting vLLM server on http://0.0.0.0:8001\n"
FREED = (f"{CORE} [gpu_worker.py:335] Sleep mode freed 6.1 GiB memory, 40.2 GiB memory is still "
         "in use.\n")
ASLEEP = f"{CORE} [abstract.py:408] It took 0.812345 seconds to fall asleep.\n"


# --- the log ------------------------------------------------------------------------------------


def test_a_ready_engine_that_fell_asleep_is_sleeping_at_a_level_its_log_does_not_say():
    log = parse_startup_log(READY + FREED + ASLEEP)

    assert log.phase == "sleeping" and log.phase in PHASES
    assert (log.asleep, log.sleep_level) == (True, None)
    assert (log.sleep_freed_gib, log.sleep_in_use_gib) == (6.1, 40.2)
    assert log.sleeping_tags == ["kv_cache", "weights"]
    assert log.asleep_since == "12-01 09:05:00"
    assert log.startup_count == 1


def test_waking_some_tags_leaves_it_asleep_and_all_of_them_wakes_it():
    partial = READY + FREED + ASLEEP + (
        f"{CORE} [abstract.py:426] It took 0.301000 seconds to wake up tags ['weights'].\n")

    half = parse_startup_log(partial)
    whole = parse_startup_log(partial + (
        f"{CORE} [abstract.py:426] It took 0.2 seconds to wake up tags ['kv_cache'].\n"))
    at_once = parse_startup_log(READY + ASLEEP + (
        f"{CORE} [abstract.py:426] It took 0.3 seconds to wake up tags "
        "{'weights', 'kv_cache'}.\n"))

    assert (half.phase, half.sleeping_tags) == ("sleeping", ["kv_cache"])
    assert (whole.phase, whole.asleep, whole.sleeping_tags) == ("ready", False, [])
    assert (at_once.phase, at_once.asleep) == ("ready", False)


def test_vllm_0_7_names_the_level_it_was_asked_for():
    text = ("INFO 03-01 10:00:00 api_server.py:895] Starting vLLM API server on http://0.0.0.0:8000\n"
            "INFO 03-01 10:05:00 api_server.py:632] sleep the engine with level 2\n"
            "INFO 03-01 10:05:01 executor_base.py:208] It took 1.2 seconds to fall asleep.\n")

    log = parse_startup_log(text)

    assert (log.phase, log.sleep_level) == ("sleeping_level_2", 2)
    woke = parse_startup_log(text + "INFO 03-01 10:06:00 executor_base.py:219] It took 0.9 "
                                    "seconds to wake up.\n")
    assert (woke.phase, woke.sleep_level) == ("ready", None)


def test_a_freed_line_without_its_figures_is_reported_and_still_means_asleep():
    log = parse_startup_log(READY + f"{CORE} [gpu_worker.py:335] Sleep mode freed None GiB memory, "
                                    "40.2 GiB memory is still in use.\n")

    assert log.phase == "sleeping" and log.sleep_freed_gib is None
    assert [line.fact for line in log.unparsed] == ["sleep_freed_gib"]


# --- the metric ---------------------------------------------------------------------------------


def _exposition(awake: float, offloaded: float, discarded: float) -> str:
    labels = 'engine="0",model_name="gemma"'
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{labels}}} 0.0\n"
        "# HELP vllm:engine_sleep_state Engine sleep state\n"
        "# TYPE vllm:engine_sleep_state gauge\n"
        f'vllm:engine_sleep_state{{{labels},sleep_state="awake"}} {awake}\n'
        f'vllm:engine_sleep_state{{{labels},sleep_state="weights_offloaded"}} {offloaded}\n'
        f'vllm:engine_sleep_state{{{labels},sleep_state="discard_all"}} {discarded}\n'
    )


@pytest.mark.parametrize(("values", "expected"), [
    ((1, 0, 0), (False, None)),
    ((0, 1, 0), (True, 1)),
    ((0, 0, 1), (True, 2)),
    ((0, 0, 0), (True, 0)),  # record_sleep_state(1, 0): paused, or a released KV cache
])
def test_the_sleep_state_gauge_gives_asleep_and_its_level(values, expected):
    snapshot = parse_engines(_exposition(*values))[0]

    assert (snapshot.asleep, snapshot.sleep_level) == expected


@pytest.mark.parametrize("values", [(1, 1, 0), (0, 1, 1), (0, 0.5, 0)])
def test_an_impossible_sleep_state_refuses_the_read(values):
    with pytest.raises(MetricsParseError, match="engine_sleep_state"):
        parse_engines(_exposition(*values))


def test_a_release_without_the_gauge_leaves_the_sleep_state_unknown():
    snapshot = parse_engines('vllm:num_requests_running{model_name="m"} 0.0\n')[0]

    assert (snapshot.asleep, snapshot.sleep_level) == (None, None)


# --- the phase ----------------------------------------------------------------------------------


def _snapshot(values):
    return parse_engines(_exposition(*values))[0]


def test_the_metric_decides_the_phase_and_its_level():
    assert phase_with_sleep("ready", _snapshot((0, 1, 0)), "ready") == "sleeping_level_1"
    assert phase_with_sleep("sleeping", _snapshot((0, 0, 1)), "ready") == "sleeping_level_2"
    # Woken since the log was last read: ready again.
    assert phase_with_sleep("sleeping_level_1", _snapshot((1, 0, 0)), "sleeping_level_1") \
        == "ready"
    # A read without the metric keeps the level an earlier read told.
    assert phase_with_sleep("sleeping", None, "sleeping_level_1") == "sleeping_level_1"
    assert phase_with_sleep("ready", None, "ready") == "ready"


def test_a_stopped_or_failed_engine_is_never_called_asleep():
    assert phase_with_sleep("stopped", _snapshot((0, 1, 0)), "sleeping_level_1") == "stopped"
    assert phase_with_sleep("failed", _snapshot((0, 1, 0)), "ready") == "failed"


# --- the ledger ---------------------------------------------------------------------------------


def _engine(node, phase, *, flags=None, version="0.33.0", **extra):
    values = dict(
        node=node, name="gemma", container_id="g" * 64, container_state="running", phase=phase,
        startup={"version": version, "weights_gib": 15.0, "kv_cache_gib": 8.0,
                 "cuda_graph_gib": 0.5, "asleep": phase != "ready", "sleep_freed_gib": 8.0},
        config={"max_num_batched_tokens": 8192,
                "all_flags": {"enable-sleep-mode": True} if flags is None else flags},
        memory_usage_bytes=17 * GIB,
    )
    values.update(extra)
    return Engine.objects.create(**values)


def test_asleep_at_level_1_it_still_holds_its_weights_and_its_kv_pool_is_freed(node):
    share = engine_share(_engine(node, "sleeping_level_1"))

    assert share.weights == 15 * GIB and share.kv_pool == 0
    assert share.cuda_graphs == GIB // 2 and share.actual == 17 * GIB
    assert share.sleeping == "sleeping_level_1"
    assert share.notes["weights"] == WEIGHTS_OFFLOADED
    assert "freed by sleep mode (level 1)" in share.notes["kv_pool"]


def test_asleep_at_level_2_its_parts_are_gone_and_what_its_process_holds_counts(node):
    engine = _engine(node, "sleeping_level_2", memory_usage_bytes=2 * GIB)
    share = engine_share(engine)

    assert (share.weights, share.kv_pool, share.actual) == (0, 0, 2 * GIB)
    assert "what its process still holds" in share.notes["actual"]
    node.ledger = build_ledger(node, T0, {"mem_total": 120 * GIB, "mem_available": 90 * GIB},
                               [engine], []).as_dict()
    bar = humanise_ledger(ledger_bar(node))
    assert [(s["label"], s["bytes"]) for s in bar["segments"] if "gemma" in s["label"]] \
        == [("gemma: process memory while asleep", 2 * GIB)]
    row = bar["engines"][0]
    assert row["weights_text"].startswith("0.00 GiB — discarded by sleep mode (level 2)")
    assert row["actual_text"].startswith("2.00 GiB — what its process still holds")


def test_the_ledger_table_says_why_the_kv_pool_reads_0(node):
    engine = _engine(node, "sleeping_level_1")
    node.ledger = build_ledger(node, T0, {"mem_total": 120 * GIB, "mem_available": 90 * GIB},
                               [engine], []).as_dict()

    row = humanise_ledger(ledger_bar(node))["engines"][0]

    assert row["kv_text"].startswith("0.00 GiB — freed by sleep mode (level 1)")
    assert row["weights_text"] == f"15.0 GiB — {WEIGHTS_OFFLOADED}"


def test_without_enable_sleep_mode_a_sleep_frees_nothing_and_the_ledger_says_so(node):
    share = engine_share(_engine(node, "sleeping_level_1", flags={}))

    assert share.weights == 15 * GIB and share.kv_pool == 8 * GIB
    assert "started without --enable-sleep-mode" in share.notes["kv_pool"]


def test_paused_since_0_31_its_kv_pool_is_unknown_and_before_it_is_kept(node):
    new = engine_share(_engine(node, "paused"))
    old = engine_share(_engine(node, "paused", version="0.20.2", name="old",
                               container_id="o" * 64))

    assert new.kv_pool is None and new.notes["kv_pool"].startswith("unknown")
    assert old.kv_pool == 8 * GIB and "kept" in old.notes["kv_pool"]


def test_asleep_at_a_level_not_reported_its_weights_are_unknown_not_0(node):
    share = engine_share(_engine(node, "sleeping", version="0.10.2"))

    assert share.weights is None and share.notes["weights"].startswith("unknown")
    assert share.kv_pool == 0


def test_an_awake_engine_is_counted_as_it_reported(node):
    share = engine_share(_engine(node, "ready"))

    assert (share.weights, share.kv_pool, share.sleeping, share.notes) == \
        (15 * GIB, 8 * GIB, None, {})


# --- pages and rules ----------------------------------------------------------------------------


def test_the_card_and_page_say_sleeping_in_words(admin_client, node):
    engine = _engine(node, "sleeping_level_1")
    card = engine_card(engine)

    assert card["phase_text"] == "sleeping (level 1)"
    assert WEIGHTS_OFFLOADED in card["sleep_text"]
    assert "vLLM logged 8.0 GiB freed as it fell asleep" in card["sleep_text"]
    page = admin_client.get("/nodes/spark-a/engines/gemma/").content.decode()
    assert '<dd data-field="phase">sleeping (level 1)</dd>' in page
    cards = admin_client.get("/nodes/spark-a/").content.decode()
    assert 'title="Engine phase">sleeping (level 1)</span>' in cards


def test_a_sleeping_engine_that_answers_is_not_down(node):
    engine = _engine(node, "sleeping_level_2")

    [condition] = engine_down.evaluate(node, {}, [engine], {}, T0)

    assert condition.value == 0.0
