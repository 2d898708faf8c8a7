"""Engines in real containers (Podman's Docker-compatible API), each running the emulator."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from django.utils import timezone

from collectors import docker_api
from collectors.engines import collect_engines
from collectors.models import Engine, EngineMetric, Event
from sparkops.testing.ports import free_port
from tests.conftest import PROJECT
from tests.containers import podman, run_container, unique_name
from tests.stored import engine_samples

pytestmark = [pytest.mark.slow, pytest.mark.django_db]
MIB = 1024**2


VLLM = str(PROJECT / "collectors" / "emulator" / "bin" / "vllm")


def _emulator(port: int, *extra: str) -> list[str]:
    return [
        VLLM, "serve", "nvidia/Gemma-4-26B-A4B-NVFP4",
        "--port", str(port), "--served-model-name", "gemma", "--kv-cache-memory-bytes", "96M",
        "--max-num-seqs", "16", "--max-num-batched-tokens", "8192",
        "--emulator-weights-bytes", "32M", "--emulator-load-seconds", "0.3",
        "--emulator-profile-seconds", "0.3", "--emulator-graph-seconds", "0.3",
        "--emulator-load", "4:200:40", "--emulator-stats-interval", "1", *extra,
    ]


def _collect_until(node, api, condition, timeout=40.0, pause=1.0):
    deadline = time.monotonic() + timeout
    while True:
        engines = {e.name: e for e in collect_engines(node, api, timezone.now())}
        if condition(engines):
            return engines
        if time.monotonic() > deadline:
            seen = [(e.name, e.phase, e.last_scrape_error) for e in engines.values()]
            raise AssertionError(f"condition not met within {timeout} s: {seen}")
        time.sleep(pause)


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


def test_discovery_flags_logs_metrics_and_rates(node, api):
    port_a, port_b = free_port(), free_port()
    name_a, name_b = unique_name("gemma"), unique_name("legacy")
    run_container(name_a, _emulator(port_a, "--emulator-load-seconds", "2"),
                  labels={"sparkops.engine": "vllm"})
    # Weights still loading (its /health says 503): the phase comes from the log.
    _collect_until(node, api, lambda found: name_a in found and found[name_a].phase == "loading",
                   timeout=5, pause=0.2)
    # No label: found because its command runs `vllm`.
    run_container(name_b, [VLLM, "serve", "org/legacy-8b", "--port", str(port_b),
                           "--emulator-style", "0.10", "--enforce-eager",
                           "--emulator-weights-bytes", "16M", "--emulator-load", "2:100:20",
                           "--emulator-load-seconds", "0.3"])
    run_container(unique_name("bystander"), ["sleep", "300"])  # not an engine

    engines = _collect_until(
        node, api,
        lambda found: {name_a, name_b} <= set(found)
        and all(found[n].phase == "ready" and found[n].rates.get("decode_tokens_per_s")
                for n in (name_a, name_b)),
    )

    assert set(engines) == {name_a, name_b}
    a, b = engines[name_a], engines[name_b]
    assert a.config["kv_cache_memory_bytes"] == 96 * MIB
    assert a.config["served_model_name"] == "gemma"
    assert a.config["max_num_seqs"] == 16
    assert a.metrics_url == f"http://127.0.0.1:{port_a}"
    codes_a = {f["code"] for f in a.findings}
    assert {"kv-bytes-skips-precheck", "moe-backend-unset"} <= codes_a
    assert a.startup["kv_cache_pinned"] is True
    assert a.startup["kv_cache_gib"] == pytest.approx(96 / 1024, abs=0.01)
    assert a.startup["version"].startswith("0.33")
    assert a.metrics["snapshot"]["model_name"] == "gemma"
    assert a.memory_usage_bytes > (96 + 32) * MIB  # really reserved, seen by the cgroup
    assert a.rates["decode_tokens_per_s"] > 0 and a.rates["prefill_tokens_per_s"] > 0
    assert b.startup["version"].startswith("0.10")
    assert "enforce-eager" in {f["code"] for f in b.findings}
    assert b.startup["kv_cache_pinned"] is False
    assert Event.objects.filter(engine=a, kind="engine-discovered").count() == 1
    phases = list(Event.objects.filter(engine=a, kind="phase-change").order_by("at")
                  .values_list("message", flat=True))
    assert phases and phases[-1].endswith("→ ready")


def test_stopped_and_failed_engines(node, api):
    stopped, failed = unique_name("stopped"), unique_name("failed")
    run_container(stopped, _emulator(free_port()), labels={"sparkops.engine": "vllm"})
    run_container(failed, _emulator(free_port(), "--emulator-fail", "free-memory"),
                  labels={"sparkops.engine": "vllm"})
    _collect_until(node, api, lambda found: found.get(stopped) is not None
                   and found[stopped].phase == "ready")

    podman("stop", "--time", "5", stopped)
    engines = _collect_until(node, api, lambda found: found[failed].container_state == "exited",
                             timeout=120)

    assert engines[stopped].phase == "stopped" and engines[stopped].exit_code == 0
    broken = engines[failed]
    assert broken.phase == "failed" and broken.exit_code != 0
    assert broken.startup["errors"][0]["kind"] == "free-memory-below-utilization"
    assert "startup-error" in {f["code"] for f in broken.findings}


def test_restart_resets_counters_without_a_negative_rate(node, api):
    port = free_port()
    name = unique_name("restart")
    run_container(name, _emulator(port), labels={"sparkops.engine": "vllm"})
    _collect_until(node, api, lambda found: bool(found.get(name) and found[name].rates.get(
        "decode_tokens_per_s")))
    before = Engine.objects.get(node=node, name=name)

    podman("restart", "--time", "2", name)
    engines = _collect_until(
        node, api, lambda found: found[name].started_at != before.started_at
        and found[name].last_scrape_ok_at and found[name].last_scrape_error == ""
        and found[name].metrics.get("identity", "").endswith(found[name].started_at.isoformat()),
    )

    after = engines[name]
    assert after.rates.get("restarted") in (True, None)  # first scrape after: no rate at all
    assert Event.objects.filter(engine=after, kind="engine-restarted").exists()
    rates = [s.value for s in engine_samples(after)
             if s.metric in {EngineMetric.PREFILL_TPS, EngineMetric.DECODE_TPS}]
    assert rates
    assert min(rates) >= 0
    engines = _collect_until(node, api, lambda found: bool(found[name].rates.get(
        "decode_tokens_per_s")))
    assert engines[name].rates["restarted"] is False


def test_recreated_bind_mount_is_a_stale_bind_mount(node, api, tmp_path):
    config_dir = Path("/tmp") / unique_name("sparkops-conf")
    config_dir.mkdir()
    (config_dir / "site.conf").write_text("server {}\n")
    name = unique_name("stale")
    port = free_port()
    try:
        run_container(name, _emulator(port), labels={"sparkops.engine": "vllm"},
                      volumes=[f"{config_dir}:/etc/engine-config"])
        fresh = _collect_until(node, api, lambda found: name in found)[name]
        assert "stale-bind-mount" not in {f["code"] for f in fresh.findings}

        shutil.rmtree(config_dir)  # a branch switch deletes and recreates the directory
        config_dir.mkdir()
        engines = {e.name: e for e in collect_engines(node, api, timezone.now())}
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)

    stale = [f for f in engines[name].findings if f["code"] == "stale-bind-mount"]
    assert len(stale) == 1 and stale[0]["severity"] == "error"
    assert str(config_dir) in stale[0]["message"]


def test_unreachable_metrics_is_a_failed_scrape_with_nothing_committed(node, api):
    port = free_port()
    name = unique_name("wrongurl")
    run_container(name, _emulator(port), labels={"sparkops.engine": "vllm",
                                                 "sparkops.url": f"http://127.0.0.1:{free_port()}"})

    engine = _collect_until(node, api, lambda found: bool(found.get(name)
                                                          and found[name].last_scrape_error))[name]

    assert "refused" in engine.last_scrape_error
    assert engine.metrics == {} and engine.rates == {}
    assert not [s for s in engine_samples(engine)
                if s.metric in {EngineMetric.DECODE_TPS, EngineMetric.REQUESTS_RUNNING}]
    assert Event.objects.filter(engine=engine, kind="scrape-failed").count() == 1


def test_container_engine_unreachable_is_recorded_on_the_node(node):
    assert collect_engines(node, None, timezone.now(), api_error="no socket") == []
    node.refresh_from_db()
    assert node.engine_discovery_error == "no socket"
    with pytest.raises(docker_api.ContainerEngineError):
        docker_api.discover_engines(docker_api.client("unix:///nonexistent/docker.sock"))


def test_gone_container_marks_the_engine_gone(node, api):
    name = unique_name("gone")
    run_container(name, _emulator(free_port()), labels={"sparkops.engine": "vllm"})
    _collect_until(node, api, lambda found: name in found)

    podman("rm", "--force", "--time", "0", name)
    collect_engines(node, api, timezone.now())

    engine = Engine.objects.get(node=node, name=name)
    assert engine.present is False and engine.phase == "gone"
    assert Event.objects.filter(engine=engine, kind="engine-gone").exists()
    assert os.path.exists("/proc")  # host PID namespace: mounts are checked through /proc


class _CountedCalls:
    """The real Docker API client, with the inspect and stats calls it makes counted."""

    def __init__(self, real, container_id):
        self._real, self._id = real, container_id
        self.inspects = self.stats_calls = 0

    def __getattr__(self, name):
        return getattr(self._real, name)

    def inspect_container(self, container_id, *args, **kwargs):
        self.inspects += container_id == self._id
        return self._real.inspect_container(container_id, *args, **kwargs)

    def stats(self, container_id, *args, **kwargs):
        self.stats_calls += container_id == self._id
        return self._real.stats(container_id, *args, **kwargs)


class _Client:
    def __init__(self, api):
        self.api = api


def test_a_container_is_inspected_again_only_when_it_may_have_changed(api, tmp_path):
    name = unique_name("held")
    run_container(name, ["sleep", "300"], labels={"sparkops.engine": "vllm"})
    container_id = podman("inspect", "--format", "{{.Id}}", name).strip()
    counted = _CountedCalls(api.api, container_id)

    def discover(**roots):
        found = docker_api.discover_engines(_Client(counted), **roots)
        return next(c for c in found if c.id == container_id)

    first = discover()
    second = discover()
    # Same process, same state: the inspect is reused and memory comes from the cgroup file.
    assert counted.inspects == 1 and counted.stats_calls == 0
    assert first.memory_usage_bytes and second.memory_usage_bytes
    stats = api.api.stats(container_id, stream=False)["memory_stats"]["usage"]
    assert abs(second.memory_usage_bytes - stats) <= max(stats // 4, 4 * MIB)

    podman("rename", name, f"{name}-renamed")
    assert discover().name == f"{name}-renamed" and counted.inspects == 2
    podman("restart", "--time", "0", f"{name}-renamed")
    restarted = discover()
    assert counted.inspects == 3 and restarted.started_at > first.started_at

    # Where /proc does not show the container (another PID namespace): inspect and stats, always.
    for _ in range(2):
        assert discover(proc_root=tmp_path).memory_usage_bytes
    assert counted.inspects == 5 and counted.stats_calls == 2
