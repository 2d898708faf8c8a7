"""Sleep mode and speculative decoding of emulated vLLM engines in real containers (Podman's
Docker-compatible API), read by the collectors as a real node's engines are.

An engine put to sleep through ``POST /sleep?level=1`` is in phase "sleeping (level 1)", its
container's memory falls by what it really freed (the KV pool only: the weights are offloaded to
host memory, which on unified memory holds them still) and the ledger counts exactly that; woken
through ``POST /wake_up`` it is ready again and holds its pool. A speculative engine's acceptance
rate, read from its counters, is the one it runs at. The container's own memory (its cgroup, the
ledger's "holds") is what is compared: this machine's MemAvailable moves by other programs'
gigabytes meanwhile, the container's cgroup only by the engine.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from django.utils import timezone

from collectors import docker_api
from collectors.enginecard import engine_card
from collectors.engines import collect_engines
from collectors.ledger import engine_share
from collectors.models import EngineMetric, Event
from collectors.vllm.sleep import WEIGHTS_OFFLOADED
from sparkops.testing.ports import free_port
from tests.conftest import PROJECT
from tests.containers import run_container, unique_name
from tests.stored import engine_samples

pytestmark = [pytest.mark.slow, pytest.mark.django_db]
MIB, GIB = 1024**2, 1024**3
KV, WEIGHTS = 256 * MIB, 128 * MIB
# The interpreter's own pages come and go a little between two reads of the cgroup.
SLACK = 24 * MIB
VLLM = str(PROJECT / "collectors" / "emulator" / "bin" / "vllm")


def _emulator(port: int, *extra: str) -> list[str]:
    return [
        VLLM, "serve", "nvidia/Gemma-4-26B-A4B-NVFP4", "--port", str(port),
        "--served-model-name", "gemma", "--kv-cache-memory-bytes", "256M",
        "--emulator-weights-bytes", "128M", "--emulator-load-seconds", "0.3",
        "--emulator-profile-seconds", "0.3", "--emulator-graph-seconds", "0.3", *extra,
    ]


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


def _collect_until(node, api, name, condition, timeout=40.0):
    deadline = time.monotonic() + timeout
    while True:
        found = {e.name: e for e in collect_engines(node, api, timezone.now())}
        engine = found.get(name)
        if engine is not None and condition(engine):
            return engine
        if time.monotonic() > deadline:
            raise AssertionError(f"not met within {timeout} s: {engine and engine.phase}, "
                                 f"{engine and engine.memory_usage_bytes}")
        time.sleep(0.5)


def _post(port: int, path: str) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_an_engine_asleep_at_level_1_frees_its_kv_pool_and_wakes_ready(node, api):
    port, name = free_port(), unique_name("sleepy")
    run_container(name, _emulator(port, "--enable-sleep-mode"),
                  labels={"sparkops.engine": "vllm"}, env={"VLLM_SERVER_DEV_MODE": "1"})
    awake = _collect_until(node, api, name, lambda e: e.phase == "ready"
                           and e.last_scrape_ok_at and e.memory_usage_bytes)
    before = engine_share(awake)

    assert _post(port, "/sleep?level=1") == {"status": "sleeping", "level": 1}
    asleep = _collect_until(node, api, name, lambda e: e.phase == "sleeping_level_1")
    during = engine_share(asleep)

    # The weights as vLLM logs them: GiB to two decimals (0.12 GiB for 128 MiB).
    assert before.kv_pool == KV and before.weights == pytest.approx(WEIGHTS, abs=GIB / 100)
    assert abs((before.actual - during.actual) - KV) <= SLACK  # the KV pool only
    assert during.kv_pool == 0 and during.weights == before.weights
    assert during.notes["weights"] == WEIGHTS_OFFLOADED
    assert engine_card(asleep)["phase_text"] == "sleeping (level 1)"
    # The log, read again at the next collection of an engine that is not settled, says so too.
    logged = _collect_until(node, api, name, lambda e: (e.startup or {}).get("asleep"))
    assert logged.phase == "sleeping_level_1" and logged.startup["phase"] == "sleeping"

    assert _post(port, "/wake_up") == {"status": "awake", "tags": None}
    woken = _collect_until(node, api, name, lambda e: e.phase == "ready")
    after = engine_share(woken)
    assert after.kv_pool == KV and after.notes == {}
    assert abs((after.actual - during.actual) - KV) <= SLACK
    changes = list(Event.objects.filter(engine=woken, kind="phase-change")
                   .order_by("at").values_list("message", flat=True))
    assert changes[-2:] == [f"{name}: ready → sleeping_level_1",
                            f"{name}: sleeping_level_1 → ready"]


def test_a_speculative_engine_is_read_at_the_acceptance_it_runs_at(node, api):
    port, name = free_port(), unique_name("drafting")
    run_container(name, _emulator(
        port, "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 4}',
        "--emulator-spec-acceptance", "0.743", "--emulator-load", "6:64:48"),
        labels={"sparkops.engine": "vllm"})

    engine = _collect_until(node, api, name,
                            lambda e: (e.rates or {}).get("spec_decode_acceptance_rate"))

    assert engine.rates["spec_decode_acceptance_rate"] == pytest.approx(0.743, abs=0.03)
    assert engine.rates["spec_decode_mean_acceptance_length"] == pytest.approx(
        1 + 4 * 0.743, abs=0.15)
    stored = {s.metric for s in engine_samples(engine)}
    assert {EngineMetric.SPEC_ACCEPTANCE, EngineMetric.SPEC_TOKENS_PER_STEP} <= stored
    summary = engine_card(engine)["spec_decode"]
    assert summary["method"] == "eagle" and summary["num_speculative_tokens"] == 4
    assert summary["text"].startswith("acceptance 7")
