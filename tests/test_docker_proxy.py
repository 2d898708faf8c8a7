"""The Docker API proxy (deploy/docker-proxy/): a real HAProxy with the shipped configuration in
front of the test run's private Podman, and SparkOps' own container seam
(:mod:`collectors.docker_api`) and runbook talking to it.

Through the proxy SparkOps lists, inspects, reads the logs and stats of, stops and starts a
managed emulated engine, and carries out a whole planned restart, with nothing refused; every
other call (create, exec, delete, pull, archive, kill, connection upgrades, crafted paths) is
answered 403 by the proxy and never reaches the engine. The proxy logs only refusals and
failures, so an empty log after SparkOps' calls also says no stream was cut by a timeout.

The configuration and the systemd unit are checked too (fast): ``haproxy -c`` accepts the
configuration with its default and overridden addresses, ``systemd-analyze verify`` the unit.
"""

from __future__ import annotations

import grp
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker.errors
import pytest

from collectors import docker_api
from collectors.docker_api import (
    container_logs,
    container_status,
    discover_engines,
    read_logs,
    start_container,
    stop_container,
)
from collectors.podman import PrivatePodman
from dashboard.audit.models import AuditEntry
from dashboard.restarts.models import Restart
from dashboard.restarts.runbook import STEPS, run_restart
from sparkops.testing.ports import wait_for
from tests.conftest import PROJECT
from tests.containers import run_container, start_podman, stop_podman, unique_name
from tests.restarts.runbook_helpers import (
    collect_until_ready,
    plan_now,
    refresh_ledger,
    start_engine,
    started_at,
)

PROXY_DIR = PROJECT / "deploy" / "docker-proxy"
CONFIG = PROXY_DIR / "haproxy.cfg"
UNIT = PROXY_DIR / "sparkops-docker-proxy.service"
HAPROXY = "/usr/sbin/haproxy"
REFUSED = "refused by the SparkOps Docker API proxy"


def _haproxy() -> str:
    if not os.access(HAPROXY, os.X_OK):
        pytest.fail("haproxy is not installed (Debian package haproxy)")
    return HAPROXY


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``haproxy -c`` of the shipped configuration with ``env`` added to this environment."""
    return subprocess.run([_haproxy(), "-c", "-f", str(CONFIG)], capture_output=True, text=True,
                          timeout=30, env={**os.environ, **env})


def _default(name: str) -> str:
    """The default the configuration gives an address variable (its ``presetenv`` line)."""
    match = re.search(rf'^\s*presetenv {name} "([^"]*)"$', CONFIG.read_text(), re.MULTILINE)
    assert match, f"{name} has no default in {CONFIG}"
    return match.group(1)


# --- the configuration and the unit (fast) ------------------------------------------------------


def test_the_defaults_are_the_socket_sparkops_uses_and_the_docker_socket():
    assert _default("SPARKOPS_PROXY_BIND") == \
        "unix@/run/sparkops-docker/docker.sock mode 660 group sparkops"
    assert _default("SPARKOPS_PROXY_ENGINE") == "unix@/var/run/docker.sock"
    unit = UNIT.read_text()
    # The unit's runtime directory is where the default socket lives, and it runs the
    # configuration where the installer puts it.
    assert re.search(r"^RuntimeDirectory=sparkops-docker$", unit, re.MULTILINE)
    assert re.search(r"^ExecStart=/usr/sbin/haproxy -Ws -f /etc/sparkops/docker-proxy.cfg$",
                     unit, re.MULTILINE)


def test_haproxy_accepts_the_configuration_with_its_default_listener(tmp_path):
    # The default listener, with this process's own group in place of "sparkops" where that
    # group does not exist here (HAProxy resolves the name while it reads the file).
    bind = _default("SPARKOPS_PROXY_BIND")
    try:
        grp.getgrnam("sparkops")
    except KeyError:
        bind = bind.replace("group sparkops", f"group {grp.getgrgid(os.getgid()).gr_name}")
    checked = _check({"SPARKOPS_PROXY_BIND": bind})
    assert checked.returncode == 0, checked.stderr
    assert "Configuration file is valid" in checked.stdout


def test_haproxy_accepts_a_tcp_listener_and_another_engine_socket():
    checked = _check({"SPARKOPS_PROXY_BIND": "0.0.0.0:2375",
                      "SPARKOPS_PROXY_ENGINE": "unix@/run/podman/podman.sock"})
    assert checked.returncode == 0, checked.stderr


def test_a_missing_sparkops_group_is_named_by_haproxy():
    try:
        grp.getgrnam("sparkops")
    except KeyError:
        pass
    else:
        pytest.skip("the group sparkops exists here")
    checked = _check({})
    assert checked.returncode != 0
    assert "unknown group name 'sparkops'" in checked.stderr


def test_the_timeouts_outlast_a_stop_that_waits_out_its_grace():
    # The docker library waits the stop's grace plus its own timeout for the engine's answer.
    longest = docker_api.STOP_TIMEOUT_SECONDS + docker_api.API_TIMEOUT_SECONDS
    timeouts = dict(re.findall(r"^\s*timeout (server|client) (\d+)s$", CONFIG.read_text(),
                               re.MULTILINE))
    assert set(timeouts) == {"server", "client"}
    assert all(int(seconds) > longest for seconds in timeouts.values()), timeouts


def test_systemd_accepts_the_unit():
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is not installed (Debian package systemd)")
    verified = subprocess.run([analyze, "verify", str(UNIT)], capture_output=True, text=True,
                              timeout=60)
    assert verified.returncode == 0, verified.stderr
    assert verified.stderr.strip() == ""


# --- a real proxy in front of the private Podman (slow) ----------------------------------------


@dataclass
class Proxy:
    """A running HAProxy with the shipped configuration: its socket, URL and log."""

    socket: Path
    log: Path

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def log_lines(self, since: int = 0) -> list[str]:
        """The lines it logged after byte ``since`` of its log (refusals and failures only)."""
        return self.log.read_bytes()[since:].decode(errors="replace").splitlines()

    def log_size(self) -> int:
        return self.log.stat().st_size


@pytest.fixture(scope="module")
def proxy(docker_host, tmp_path_factory) -> Iterator[Proxy]:
    """HAProxy on a socket of this run's own, forwarding to the private Podman's socket;
    stopped when the module ends, passed or failed."""
    folder = tmp_path_factory.mktemp("docker-proxy")
    listen, log = folder / "docker.sock", folder / "haproxy.log"
    env = {**os.environ, "SPARKOPS_PROXY_BIND": f"unix@{listen} mode 600",
           "SPARKOPS_PROXY_ENGINE": f"unix@{docker_host.removeprefix('unix://')}"}
    with log.open("wb") as output:
        process = subprocess.Popen([_haproxy(), "-db", "-f", str(CONFIG)], env=env,
                                   stdin=subprocess.DEVNULL, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: listen.exists() or process.poll() is not None, 10, "the proxy's socket")
        if process.poll() is not None:
            pytest.fail(f"haproxy exited with status {process.returncode}: {log.read_text()}")
        yield Proxy(socket=listen, log=log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def through_proxy(proxy) -> Iterator[docker_api.docker.DockerClient]:
    client = docker_api.client(proxy.url)
    yield client
    client.close()


@pytest.fixture
def direct(docker_host) -> Iterator[docker_api.docker.DockerClient]:
    client = docker_api.client(docker_host)
    yield client
    client.close()


@pytest.mark.slow
@pytest.mark.django_db
def test_sparkops_reads_stops_and_starts_a_managed_engine_through_the_proxy(
        node, proxy, through_proxy, tmp_path):
    api = through_proxy
    logged = proxy.log_size()
    real = start_engine(tmp_path / "engine")

    # A collection: the list, inspects, the startup log and the engine's own endpoints.
    assert collect_until_ready(node, api, real.name)[real.name].phase == "ready"
    # Where /proc does not show the container, its memory comes from the engine's stats call.
    found = {c.name: c for c in discover_engines(api, proc_root=tmp_path / "no-proc")}
    engine = found[real.name]
    assert engine.kind == "vllm" and engine.labels["sparkops.manage"] == "true"
    assert engine.running and engine.memory_usage_bytes and engine.memory_usage_bytes > 0
    assert "Starting vLLM" in container_logs(api, real.container_id)
    first_start = started_at(api, real.container_id)

    stop_container(api, real.container_id, timeout_seconds=5)
    stopped = container_status(api, real.container_id)
    start_container(api, real.container_id)
    started = container_status(api, real.container_id)

    assert not stopped.running and stopped.exists
    assert started.running and started_at(api, real.container_id) != first_start
    assert proxy.log_lines(logged) == []


@pytest.mark.slow
@pytest.mark.alone  # the runbook judges the host's own MemAvailable, as in its own tests
@pytest.mark.django_db
def test_a_planned_restart_runs_every_step_through_the_proxy(node, proxy, through_proxy,
                                                            tmp_path, settings):
    settings.SPARKOPS_RESTART_DRAIN_TIMEOUT_SECONDS = 3
    settings.SPARKOPS_RESTART_MIN_DEADLINE_SECONDS = 30
    # The page cache is the helper's business, not the proxy's: a stand-in that reports a drop.
    helper = tmp_path / "drop-caches"
    helper.write_text("#!/bin/sh\necho 'Cached before: 4096 kB'\necho 'Cached after: 1024 kB'\n")
    helper.chmod(0o755)
    settings.SPARKOPS_DROP_CACHES_COMMAND = [str(helper)]
    api = through_proxy
    logged = proxy.log_size()
    real = start_engine(tmp_path / "engine")
    engine = collect_until_ready(node, api, real.name)[real.name]
    refresh_ledger(node)
    first_start = started_at(api, real.container_id)

    restart = run_restart(plan_now(engine).pk, api=api, poll_seconds=0.2)

    assert restart.status == Restart.Status.SUCCEEDED, restart.outcome
    assert list(restart.steps.order_by("started_at", "pk").values_list("step", "ok")) == \
        [(step, True) for step in STEPS]
    assert list(AuditEntry.objects.filter(restart=restart).order_by("at", "pk")
                .values_list("action", "allowed")) == [
        ("run-restart", True), ("stop-engine", True), ("drop-caches", True),
        ("start-engine", True)]
    assert started_at(api, real.container_id) != first_start
    assert restart.container_state["running"] is True
    assert proxy.log_lines(logged) == []


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason=(
    "a known defect, seen now and then on this project's test machine since 2026-12-02: Podman "
    "4.3.1 behind HAProxy 2.6 stops sending a long log part-way until the read times out; "
    "SparkOps ends "
    "such a read as capped (collectors.docker_api.STALLED) and goes on from its cursor at the "
    "next read, but a single read is not yet the whole log as it is direct"))
def test_a_long_log_streams_through_the_proxy_as_it_does_direct(proxy, through_proxy, direct):
    logged = proxy.log_size()
    # 30,000 entries (about 500 KiB with their frames and stamps): many times HAProxy's
    # buffers, read well within the log read's deadline.
    container_id = run_container(unique_name("chatty"),
                                 ["sh", "-c", "seq 1 30000; exec sleep 300"])
    wait_for(lambda: container_logs(direct, container_id).endswith("30000"), 30,
             "the container's 30,000 lines")

    proxied, straight = read_logs(through_proxy, container_id), read_logs(direct, container_id)

    assert proxied.text.splitlines() == [str(n) for n in range(1, 30001)]
    assert proxied == straight and not proxied.capped
    # And on, from its cursor, on the same kept-alive connections: nothing new.
    assert read_logs(through_proxy, container_id, cursor=proxied.cursor).text == ""
    assert proxy.log_lines(logged) == []


@pytest.mark.slow
def test_a_stop_answered_only_after_its_grace_passes_the_proxy(proxy, through_proxy, direct):
    # A plain `sleep` as the container's first process ignores SIGTERM: the engine answers the
    # stop only when its grace is over and it has sent SIGKILL, longer than the proxy's
    # request timeout.
    container_id = run_container(unique_name("stubborn"), ["sleep", "300"])
    logged = proxy.log_size()
    begun = time.monotonic()

    try:
        stop_container(through_proxy, container_id, timeout_seconds=12)
    finally:
        # Should the proxy cut the answer short, the engine is still stopping the container:
        # removing it meanwhile would leave its process behind. Let the stop end first.
        direct.api.wait(container_id, timeout=30)

    assert time.monotonic() - begun >= 11
    assert not container_status(through_proxy, container_id).running
    assert proxy.log_lines(logged) == []


def _raw(listen: Path, method: str, path: str, headers: str = "") -> tuple[int, str]:
    """One HTTP request, written by hand to the proxy's socket: its status and body."""
    with socket.socket(socket.AF_UNIX) as connection:
        connection.settimeout(10)
        connection.connect(str(listen))
        connection.sendall(f"{method} {path} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n"
                           f"Content-Length: 0\r\n{headers}\r\n".encode())
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode(errors="replace")


@pytest.mark.slow
def test_every_other_call_is_refused_by_the_proxy_and_never_reaches_the_engine(
        proxy, through_proxy, direct):
    container_id = run_container(unique_name("bystander"), ["sleep", "300"])
    before = direct.api.inspect_container(container_id)
    containers_before = {c["Id"] for c in direct.api.containers(all=True)}
    api = through_proxy.api
    logged = proxy.log_size()
    # What the docker library sends for each: create, exec, remove, pull, archive, kill, restart.
    library_calls = {
        "create": lambda: through_proxy.containers.create("localhost/none", ["true"]),
        "exec": lambda: api.exec_create(container_id, ["true"]),
        "remove": lambda: api.remove_container(container_id, force=True),
        "pull": lambda: through_proxy.images.pull("localhost/none", tag="latest"),
        "archive": lambda: api.get_archive(container_id, "/etc/hostname"),
        "put archive": lambda: api.put_archive(container_id, "/tmp", b""),
        "kill": lambda: api.kill(container_id),
        "restart": lambda: api.restart(container_id, timeout=0),
        "images": lambda: api.images(),
        "info": lambda: api.info(),
    }
    for what, call in library_calls.items():
        with pytest.raises(docker.errors.APIError) as refused:
            call()
        assert refused.value.status_code == 403, what
        assert REFUSED in str(refused.value.explanation), what

    v = f"/v{api.api_version}"
    raw_calls = [
        ("GET", f"{v}/containers/{container_id}/../../images/json", ""),
        ("GET", f"{v}/containers/%2e%2e/images/json", ""),
        ("GET", f"{v}/containers/{container_id}%2F..%2F..%2Fimages/json", ""),
        ("GET", f"{v}/containers//json", ""),
        ("GET", f"{v}/containers/{container_id}/export", ""),
        ("GET", f"{v}/containers/{container_id}/attach/ws", ""),
        ("POST", f"{v}/containers/{container_id}/attach?stream=1&stdin=1", ""),
        ("DELETE", f"{v}/containers/{container_id}", ""),
        ("PUT", f"{v}/containers/{container_id}/json", ""),
        ("POST", f"{v}/containers/{container_id}/json", ""),
        ("POST", f"{v}/containers/{container_id}/update", ""),
        ("POST", "/v4.0.0/libpod/containers/create", ""),
        ("GET", "/v4.0.0/libpod/containers/json", ""),
        ("POST", f"{v}/containers/{container_id}/start",
         "Connection: Upgrade\r\nUpgrade: tcp\r\n"),
    ]
    for method, path, headers in raw_calls:
        status, body = _raw(proxy.socket, method, path, headers)
        assert status == 403, (method, path, status, body)
        assert REFUSED in body, (method, path)
    # The same hand-written request for a call SparkOps makes goes through.
    assert _raw(proxy.socket, "GET", f"{v}/containers/{container_id}/json")[0] == 200

    after = direct.api.inspect_container(container_id)
    assert after["State"]["Running"] and after["State"]["StartedAt"] == \
        before["State"]["StartedAt"]
    assert {c["Id"] for c in direct.api.containers(all=True)} == containers_before
    refusals = proxy.log_lines(logged)
    assert len(refusals) == len(library_calls) + len(raw_calls)
    assert all(" 403 " in line and "<NOSRV>" in line for line in refusals), refusals


# --- the unit under a real systemd (slow) -------------------------------------------------------
# systemd runs as the first process of a container over this machine's own file system (an
# overlay: the groups, user and files made there vanish with it), booted only as far as
# sysinit.target, with the capabilities its sandboxing needs inside the container (and the one
# to look at the proxy's namespaces). The proxy's engine is a Podman of the test's own, whose
# socket is mounted where Docker's would be.

UNIT_CHECK = r"""
set -e
groupadd docker && groupadd sparkops && useradd --no-create-home --gid sparkops sparkops
chgrp docker /var/run/docker.sock && chmod 660 /var/run/docker.sock
mkdir -p /etc/sparkops
cp /deploy/haproxy.cfg /etc/sparkops/docker-proxy.cfg
cp /deploy/sparkops-docker-proxy.service /etc/systemd/system/
systemctl daemon-reload
systemctl start sparkops-docker-proxy
pid=$(systemctl show --property MainPID --value sparkops-docker-proxy)
echo "user: $(stat -c %U /proc/$pid)"
echo "groups: $(ps -o supgrp= -p $pid)"
echo "socket: $(stat -c '%A %G' /run/sparkops-docker/docker.sock)"
own=$(readlink /proc/$pid/ns/net) && init=$(readlink /proc/1/ns/net)
echo "own network: $own (systemd's: $init)"
grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/$pid/status | tr -s '\t' ' '
# status USER METHOD PATH: the proxy's HTTP status for USER's request, or "refused".
status() {
  runuser -u "$1" -- python3 -c '
import socket, sys
client = socket.socket(socket.AF_UNIX)
client.connect("/run/sparkops-docker/docker.sock")
client.sendall(f"{sys.argv[1]} {sys.argv[2]} HTTP/1.0\r\nHost: engine\r\n\r\n".encode())
print(client.recv(64).split()[1].decode())' "$2" "$3" 2>/dev/null || echo refused
}
echo "list: $(status sparkops GET /containers/json)"
echo "create: $(status sparkops POST /containers/create)"
echo "others: $(status nobody GET /version)"
systemctl reload sparkops-docker-proxy
# The reload returns once the signal is sent; HAProxy's master then says RELOADING=1 and READY=1
# when its new worker serves (sd_notify), and the unit is "reloading" in between.
for _ in $(seq 100); do
  [ "$(systemctl is-active sparkops-docker-proxy)" = reloading ] || break
  sleep 0.1
done
echo "after reload: $(systemctl is-active sparkops-docker-proxy)"
"""


def _in_container(private: PrivatePodman, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*private.argv, "exec", "systemd", *command], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_the_unit_runs_the_proxy_under_systemd_in_its_sandbox():
    private = PrivatePodman(Path(tempfile.mkdtemp(prefix="sparkops-unit-")))
    try:
        start_podman(private)
        private("run", "--detach", "--name", "systemd", "--systemd=always",
                "--cap-add", "SYS_ADMIN,NET_ADMIN,SYS_PTRACE",
                "--tmpfs", "/tmp:rw,notmpcopyup", "--tmpfs", "/run:rw,notmpcopyup",
                "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                "--volume", f"{private.socket}:/var/run/docker.sock",
                "--volume", f"{PROXY_DIR}:/deploy:ro",
                "--rootfs", "/:O", "/lib/systemd/systemd", "--unit=sysinit.target")
        wait_for(lambda: _in_container(private, "systemctl", "is-system-running").stdout.strip()
                 in ("running", "degraded"), 30, "systemd's start")

        done = _in_container(private, "sh", "-c", UNIT_CHECK)
        report = done.stdout + done.stderr
        assert done.returncode == 0, report
        facts = dict(line.split(": ", 1) for line in report.splitlines() if ": " in line)
        assert facts["user"] == "sparkops-docker-proxy", report
        assert set(facts["groups"].split(",")) == {"sparkops-docker-proxy", "docker", "sparkops"}
        assert facts["socket"] == "srw-rw---- sparkops"
        own, init = re.fullmatch(r"(net:\[\d+\]) \(systemd's: (net:\[\d+\])\)",
                                 facts["own network"]).groups()
        assert own != init
        assert re.fullmatch(r"0+", facts["CapEff"].strip()), report
        assert facts["NoNewPrivs"].strip() == "1" and facts["Seccomp"].strip() == "2"
        assert (facts["list"], facts["create"], facts["others"]) == ("200", "403", "refused")
        assert facts["after reload"] == "active"
    finally:
        stop_podman(private)
