"""GPU processes to containers: cgroup parsing on golden procfs files, grouping, and a real
Podman container where Podman is installed."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from collectors.nvml import processes_by_container, read_gpus
from collectors.procfs import container_id_for_pid, container_ids_for_pids
from tests.nvml.stand_in import GB10_GRAPHICS_PID, GB10_VLLM_PIDS, GIB, StandInNvml, gb10, h100

PROCFS = Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "procfs"


@pytest.mark.parametrize(
    ("pid", "expected"),
    [
        pytest.param(
            1001,
            "6de102c1cecc011032305908295668eedad74d736c6d216e4c42f416ae84988f",
            id="docker-systemd-cgroup-v2",
        ),
        pytest.param(
            1002,
            "2a759f8fac4d817ff2bc28c224d51c5030f915c0c14997110517984ca9aa8d0f",
            id="docker-cgroupfs-cgroup-v1",
        ),
        pytest.param(
            1003,
            "50441b5e7a2a26d2b8c70e8675122e3db74c157955230f1da5be639ee5e97267",
            id="podman-systemd",
        ),
        pytest.param(
            1004,
            "53524afa757bb9c4b03c7d93dbb7028703f61cb1c5085dd3028933f3525f1358",
            id="podman-cgroupfs",
        ),
        pytest.param(
            1005,
            "56dfa3bc944415a972b0fe05883435f6f061150cc65600d923a24fd565932362",
            id="podman-rootless",
        ),
        pytest.param(
            1006,
            "94a1b9dffb88f34d73bb91ba12beb9644f68b29e507683f542e6919982664063",
            id="podman-pod-member",
        ),
        pytest.param(
            1007,
            "da15599c093481a92ee93fb9e4deee74036b6f5ec2ea7215bb4a3fe33dbb3d52",
            id="docker-in-docker-outermost",
        ),
        pytest.param(1008, None, id="podman-conmon-is-not-the-container"),
        pytest.param(1009, None, id="kubernetes-containerd"),
        pytest.param(1010, None, id="host-session"),
        pytest.param(1011, None, id="malformed"),
        pytest.param(999_999, None, id="exited-process"),
    ],
)
def test_container_id_from_cgroup_file(pid: int, expected: str | None) -> None:
    assert container_id_for_pid(pid, proc_root=PROCFS) == expected


def test_container_ids_for_the_pids_of_a_report() -> None:
    found = container_ids_for_pids([1001, 1010], proc_root=str(PROCFS))

    assert found == {
        1001: "6de102c1cecc011032305908295668eedad74d736c6d216e4c42f416ae84988f",
        1010: None,
    }


def test_processes_grouped_by_container_sum_known_memory_only() -> None:
    report = read_gpus(StandInNvml([gb10(), h100()]), host_memory_bytes=2048 * GIB)
    engine_a, engine_b = "a" * 64, "b" * 64
    mapping = {GB10_VLLM_PIDS[0]: engine_a, GB10_VLLM_PIDS[1]: engine_b, 5_002: engine_b}

    grouped = processes_by_container(report, mapping)

    assert grouped[engine_a].used_gpu_memory_bytes == 40 * GIB
    assert [(i, p.pid) for i, p in grouped[engine_a].processes] == [(0, GB10_VLLM_PIDS[0])]
    # PID 5002 on the second GPU has no figure from NVML: the container's total is unknown.
    assert {p.pid for _, p in grouped[engine_b].processes} == {GB10_VLLM_PIDS[1], 5_002}
    assert grouped[engine_b].used_gpu_memory_bytes is None
    host_pids = {p.pid for _, p in grouped[None].processes}
    assert host_pids == {GB10_GRAPHICS_PID, 5_001, 5_003}


PODMAN_FLAGS = ["--runtime", "runc", "--cgroup-manager", "cgroupfs"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")
def test_real_podman_container_is_found_from_its_host_pid() -> None:
    name = f"sparkops-nvml-test-{uuid.uuid4().hex[:8]}"
    run = [
        "podman",
        *PODMAN_FLAGS,
        "run",
        "-d",
        "--name",
        name,
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--network",
        "host",
        "--rootfs",
        "/:O",
        "sleep",
        "60",
    ]
    started = subprocess.run(run, capture_output=True, text=True, timeout=120, check=False)
    assert started.returncode == 0, started.stderr
    try:
        inspect = subprocess.run(
            ["podman", *PODMAN_FLAGS, "inspect", "--format", "{{.Id}} {{.State.Pid}}", name],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        container_id, pid = inspect.stdout.split()

        assert container_id_for_pid(int(pid)) == container_id
    finally:
        subprocess.run(
            ["podman", *PODMAN_FLAGS, "rm", "-f", "-t", "0", name],
            capture_output=True,
            timeout=120,
            check=False,
        )


def test_one_cgroup_parser_reads_every_hierarchy_line() -> None:
    from collectors.procfs import CgroupEntry, container_id_in_cgroup_path, parse_cgroup

    cid = "ab" * 32
    entries = parse_cgroup(f"12:memory:/docker/{cid}\n"
                           "4:cpu,cpuacct:/user.slice\n"
                           f"0::/system.slice/docker-{cid}.scope/a:b\n"
                           "not a cgroup line\n")

    assert entries == [
        CgroupEntry("12", ("memory",), f"/docker/{cid}"),
        CgroupEntry("4", ("cpu", "cpuacct"), "/user.slice"),
        CgroupEntry("0", (), f"/system.slice/docker-{cid}.scope/a:b"),
    ]
    assert [container_id_in_cgroup_path(entry.path) for entry in entries] == [cid, None, cid]
