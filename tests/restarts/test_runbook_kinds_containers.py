"""Planned restarts of every engine kind, against real engines: the emulator speaking llama.cpp's
``llama-server`` and Ollama in Podman containers, reached through the Docker-compatible API,
with the node's real /proc/meminfo. Each restart waits on the kind's own health endpoint
(Ollama has no ``/health``) and follows the kind's own startup log; a neighbour's startup is
judged by the neighbour's kind."""

from __future__ import annotations

import pytest

from collectors import docker_api
from collectors.kinds.registry import READERS
from dashboard.restarts.models import Restart
from dashboard.restarts.runbook import STEPS, run_restart
from tests.containers import podman
from tests.restarts.runbook_helpers import (
    RealEngine,
    collect_until_ready,
    plan_now,
    refresh_ledger,
    started_at,
)
from tests.restarts.runbook_helpers import start_engine as start_real_engine

# alone: the runbook judges the host's own MemAvailable (whether a stopped engine's memory
# came back, whether the next start fits), which engines of tests beside it would move.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.alone]
MIB = 1024**2
POLL = 0.2
# Steps that must succeed whatever the machine: the page-cache drop needs root and a cooldown
# free of other drops, so its outcome is the re-check's business, not these tests'.
MUST_SUCCEED = [step for step in STEPS if step != "drop_caches"]


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


@pytest.fixture
def start_engine(tmp_path):
    """Start engines for one test and remove them after it (an engine left running would be
    the next test's neighbour)."""
    started: list[RealEngine] = []

    def start(name: str, **options: object) -> RealEngine:
        started.append(start_real_engine(tmp_path / name, **options))
        return started[-1]

    yield start
    for real in started:
        podman("rm", "--force", "--time", "0", real.name)


@pytest.fixture(autouse=True)
def _quick_restarts(settings):
    settings.SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS = 3
    settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS = 30
    settings.SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS = 300


def _ok_steps(restart: Restart) -> dict[str, bool | None]:
    return dict(restart.steps.values_list("step", "ok"))


def test_a_llamacpp_server_is_restarted_and_its_startup_measured_from_its_own_log(
        node, api, start_engine):
    real = start_engine("qwen", kind="llamacpp")
    engine = collect_until_ready(node, api, real.name)[real.name]
    assert engine.kind == "llamacpp"
    refresh_ledger(node)
    first_start = started_at(api, real.container_id)

    restart = run_restart(plan_now(engine).pk, api=api, poll_seconds=POLL)

    assert restart.status == Restart.Status.SUCCEEDED, restart.outcome
    assert all(_ok_steps(restart)[step] for step in MUST_SUCCEED), _ok_steps(restart)
    steps = {s.step: s for s in restart.steps.all()}
    # Its need from its own log: 32 MiB of weights and a 32 MiB KV pool (-c 8192 × 4 KiB).
    assert steps["precheck"].data["parts"]["weights"] == 32 * MIB
    assert steps["precheck"].data["parts"]["kv_pool"] == 32 * MIB
    # llama-server's /metrics said no request was in flight (not vLLM's /metrics).
    assert steps["drain"].data["drained"] is True, steps["drain"].message
    # The phases as llama-server's log told them: loading its weights first, ready last.
    phases = [p["phase"] for p in steps["follow"].data["phases"]]
    assert phases[0] == "loading" and phases[-1] == "ready", phases
    assert 0.5 < restart.startup_seconds < 20
    assert restart.after["kv_cache_tokens"] == 8192
    assert restart.after["kv_cache_gib"] == pytest.approx(32 / 1024)
    assert "; KV pool 0.03 GiB, 8,192 tokens." in restart.outcome
    assert started_at(api, real.container_id) != first_start
    assert restart.container_state["running"] is True


def test_an_ollama_server_is_restarted_waiting_on_its_version_endpoint(node, api,
                                                                      start_engine):
    real = start_engine("chat", kind="ollama")
    engine = collect_until_ready(node, api, real.name)[real.name]
    assert engine.kind == "ollama"
    refresh_ledger(node)
    loaded = engine.metrics["details"]["size_bytes"]
    first_start = started_at(api, real.container_id)

    restart = run_restart(plan_now(engine).pk, api=api, poll_seconds=POLL)

    assert restart.status == Restart.Status.SUCCEEDED, restart.outcome
    assert all(_ok_steps(restart)[step] for step in MUST_SUCCEED), _ok_steps(restart)
    steps = {s.step: s for s in restart.steps.all()}
    # Ollama reports no weights or KV pool apart: its need is its loaded model's whole size.
    assert steps["precheck"].data["parts"]["loaded_models"] == loaded > 48 * MIB
    assert steps["precheck"].data["need_bytes"] == loaded
    # Ollama reports no requests in flight: the drain gave them its whole timeout, and says so.
    drain = steps["drain"]
    assert drain.data["drained"] is None and drain.data["waited_seconds"] >= 3
    why = READERS["ollama"].never_reported["requests"]
    assert drain.message == ("waited the whole drain timeout (3 s) for requests in flight to "
                             f"finish: {why}; going on")
    assert [p["phase"] for p in steps["follow"].data["phases"]] == ["ready"]
    assert 0 < restart.startup_seconds < 20
    assert restart.outcome.startswith("Ready ") and "KV pool" not in restart.outcome
    assert started_at(api, real.container_id) != first_start


def test_a_serving_ollama_neighbour_does_not_hold_a_start(node, api, start_engine):
    neighbour = start_engine("chat", kind="ollama")
    real = start_engine("engine")
    engine = collect_until_ready(node, api, real.name, neighbour.name)[real.name]
    refresh_ledger(node)

    restart = run_restart(plan_now(engine).pk, api=api, poll_seconds=POLL)

    # Ollama answers /api/version, not /health: judged by its own kind it serves, so the
    # vLLM engine starts at once instead of waiting for a start that already ended.
    assert restart.status == Restart.Status.SUCCEEDED, restart.outcome
    assert restart.steps.get(step="recheck").data["neighbours_waited_seconds"] < 2


def test_a_llamacpp_neighbour_loading_its_weights_holds_a_start_until_its_kv_is_sized(
        node, api, start_engine):
    real = start_engine("engine")
    engine = collect_until_ready(node, api, real.name)[real.name]
    neighbour = start_engine("qwen", kind="llamacpp", load_seconds=4)
    collect_until_ready(node, api, real.name)  # the neighbour is present, still loading
    refresh_ledger(node)

    restart = run_restart(plan_now(engine).pk, api=api, poll_seconds=POLL)

    assert restart.status == Restart.Status.SUCCEEDED, restart.outcome
    assert restart.steps.get(step="recheck").data["neighbours_waited_seconds"] >= 1
    # What the neighbour had logged when this engine was started: its KV cache, at least.
    start = restart.steps.get(step="start").started_at
    parser = READERS["llamacpp"].new_log_parser()
    parser.feed(podman("logs", "--until", start.isoformat(), neighbour.name))
    logged = parser.result()
    assert logged.phase in ("kv_allocated", "ready") and logged.kv_cache_tokens == 8192
