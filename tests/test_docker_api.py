"""The container-engine seam's pure parts: what counts as an engine, times, URLs."""

from datetime import UTC, datetime

import pytest

from collectors.docker_api import (
    EngineContainer,
    is_vllm_engine,
    metrics_base_url,
    parse_docker_time,
)


def _attrs(path="python3", args=(), image="", labels=None):
    return {"Path": path, "Args": list(args), "Config": {"Image": image, "Labels": labels or {}}}


@pytest.mark.parametrize(("attrs", "expected"), [
    (_attrs("vllm", ["serve", "m"]), True),
    (_attrs("/usr/local/bin/vllm", ["serve", "m"]), True),
    (_attrs("python3", ["-m", "vllm.entrypoints.openai.api_server"]), True),
    (_attrs("bash", ["-c", "exec vllm serve m --port 8001"]), True),
    (_attrs("sh", image="nvcr.io/nvidia/vllm:26.08-py3"), True),
    (_attrs("sh", image="eugr/spark-vllm-docker"), True),
    (_attrs("sleep", ["300"], labels={"sparkops.engine": "vllm"}), True),
    (_attrs("vllm", ["serve", "m"], labels={"sparkops.engine": "none"}), False),
    (_attrs("postgres"), False),
    (_attrs("node", ["server.js"], image="openvllmish/app"), False),
])
def test_what_counts_as_a_vllm_engine(attrs, expected):
    assert is_vllm_engine(attrs) is expected


def test_docker_times_with_nanoseconds_and_the_zero_time():
    assert parse_docker_time("2026-11-30T08:15:45.174491257Z") == datetime(
        2026, 11, 30, 8, 15, 45, 174491, tzinfo=UTC)
    assert parse_docker_time("2026-11-30T17:15:45+09:00").utcoffset().total_seconds() == 9 * 3600
    assert parse_docker_time("0001-01-01T00:00:00Z") is None
    assert parse_docker_time("yesterday") is None


def _container(**overrides):
    values = dict(id="c" * 64, name="gemma", image="", state="running", started_at=None,
                  restart_count=0, exit_code=None, pid=1, command=[], env={}, labels={},
                  mounts=[], network_mode="bridge", published_ports={"8001/tcp": 18001})
    values.update(overrides)
    return EngineContainer(**values)


def test_metrics_url_from_label_host_network_or_published_port():
    assert metrics_base_url(_container(labels={"sparkops.url": "http://10.0.0.5:9000/"}), 8001) \
        == "http://10.0.0.5:9000"
    assert metrics_base_url(_container(network_mode="host"), 8001) == "http://127.0.0.1:8001"
    assert metrics_base_url(_container(), 8001) == "http://127.0.0.1:18001"
    assert metrics_base_url(_container(), 8000) is None  # not published: unreachable from here


# --- the container's memory and first process, from /proc and the cgroup files ---------------

CID = "ab" * 32


def _proc(tmp_path, pid, cgroup, starttime="4242"):
    folder = tmp_path / "proc" / str(pid)
    folder.mkdir(parents=True)
    (folder / "cgroup").write_text(cgroup)
    # comm may hold spaces and parentheses: fields are counted after the last ")"
    (folder / "stat").write_text(f"{pid} (vllm (x) y) S 1 " + " ".join(["0"] * 17)
                                 + f" {starttime} 0 0\n")
    return tmp_path / "proc"


def test_cgroup_v2_container_path_and_its_memory_file(tmp_path):
    from collectors.docker_api import _cgroup_memory, _memory_file
    from collectors.procfs import container_cgroups, process_start_time

    proc = _proc(tmp_path, 7, f"0::/machine.slice/libpod-{CID}.scope/container\n")
    cgroups = container_cgroups(7, CID, proc)
    assert cgroups == {"": f"machine.slice/libpod-{CID}.scope"}  # the container's own cgroup
    assert _memory_file(cgroups) == f"machine.slice/libpod-{CID}.scope/memory.current"
    root = tmp_path / "cgroup"
    (root / f"machine.slice/libpod-{CID}.scope").mkdir(parents=True)
    (root / f"machine.slice/libpod-{CID}.scope/memory.current").write_text("123456\n")
    assert _cgroup_memory(_memory_file(cgroups), root) == 123456
    assert process_start_time(7, proc) == "4242"


def test_cgroup_v1_memory_controller_wins_over_the_unified_line(tmp_path):
    from collectors.docker_api import _memory_file
    from collectors.procfs import container_cgroups

    proc = _proc(tmp_path, 8, f"4:memory:/docker/{CID}\n1:cpu,cpuacct:/docker/{CID}\n"
                              f"0::/docker/{CID}\n")
    assert _memory_file(container_cgroups(8, CID, proc)) == \
        f"memory/docker/{CID}/memory.usage_in_bytes"


def test_a_process_of_another_container_or_namespace_is_not_trusted(tmp_path):
    from collectors.docker_api import _cgroup_memory
    from collectors.procfs import container_cgroups, process_start_time

    proc = _proc(tmp_path, 9, "0::/user.slice/session-1.scope\n")
    assert container_cgroups(9, CID, proc) is None  # the PID is not this container's
    assert container_cgroups(10, CID, proc) is None  # no such process
    assert process_start_time(10, proc) is None
    proc = _proc(tmp_path / "ns", 11, f"0::/../../libpod-{CID}\n")
    assert container_cgroups(11, CID, proc) is None  # outside this cgroup namespace
    assert _cgroup_memory(None, tmp_path) is None
    assert _cgroup_memory("missing/memory.current", tmp_path) is None
