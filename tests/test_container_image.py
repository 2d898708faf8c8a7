"""SparkOps as a container: the Dockerfile builds with Podman and compose.yaml's service watches
the host from inside it.

The slow test does what an admin does, for real, without a registry: a Debian bookworm root
made by debootstrap (python3, python3-venv and HAProxy) is imported as the local base image,
``podman-compose build`` builds the repository's Dockerfile on it (every step, on every run, in
a fresh private Podman), and ``podman-compose up`` starts the shipped compose.yaml (with
tests/fixtures/compose.test.yaml dropping only the GPU reservation, using that base for the
proxy's HAProxy, and lowering ulimits). SparkOps then runs
as uid 10001 without capabilities, reads the host's memory through the host's /proc (its
MemTotal is this machine's), and finds an emulated engine container on the test's Podman
through the Docker API proxy service: the engine's processes in the host's PID namespace, its
memory in the host's cgroups and its metrics on the host's loopback.

The image's storage is a :class:`collectors.podman.PrivatePodman` of its own, destroyed at the
end with everything in it (containers, images, volumes), pass or fail; the engine runs on the
session's Podman (tests/containers.py), whose API socket the proxy service is given as the
container engine's socket.

What is kept between runs is debootstrap's output alone, the base the Dockerfile starts FROM: a
tar in ``$SPARKOPS_TEST_CACHE`` (by default ``/var/cache/sparkops-tests``), outside the checkout,
named by the release and a hash of everything debootstrap is given (``_base_cache_path``). It is
written under a temporary name and renamed into place, with its sha256 beside it, and used only
while that sha256 matches and it is younger than ``BASE_MAX_AGE_DAYS`` (so it follows Debian's
point releases); otherwise it is made again. That is safe because the base holds nothing of
SparkOps: the Dockerfile asks only for a bookworm root with python3 and python3-venv, and what
the test proves, that the Dockerfile builds and the image runs as compose.yaml says, is built
from the Dockerfile on every run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from collectors.podman import LeftoverError, PodmanError, PrivatePodman
from sparkops.testing.ports import free_port, wait_for_port
from sparkops.version import VERSION
from tests.conftest import PROJECT
from tests.containers import SESSION_PODMAN, run_container, unique_name
from tests.processes import sign_in

COMPOSE_FILE = PROJECT / "compose.yaml"
TEST_OVERRIDE = PROJECT / "tests" / "fixtures" / "compose.test.yaml"
DOCKERFILE = PROJECT / "Dockerfile"
PROXY_CONFIG = PROJECT / "deploy" / "docker-proxy" / "haproxy.cfg"
BASE_IMAGE = "localhost/sparkops-test-base"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_RELEASE = "bookworm"
# The base's packages: what the Dockerfile needs of a Debian base, and HAProxy for the proxy.
BASE_PACKAGES = "python3,python3-venv,haproxy"
DEBOOTSTRAP = ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", BASE_RELEASE]
# Where the base is kept between runs (outside the checkout), and for how long at most.
TEST_CACHE = Path(os.environ.get("SPARKOPS_TEST_CACHE", "/var/cache/sparkops-tests"))
BASE_MAX_AGE_DAYS = 30
# The trust store pip inside the build uses to reach the package index: this machine's own.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
SPARKOPS_UID = 10001
PASSWORD = "container-test-password-1"
EXPORT_TOKEN = "container-test-export-token-0123456789"
VLLM = str(PROJECT / "collectors" / "emulator" / "bin" / "vllm")
MIB = 1024**2
GIB = 1024**3


def _compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _host_mem_total_bytes() -> int:
    line = next(line for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:"))
    return int(line.split()[1]) * 1024


def _volume_parts(entry: str) -> tuple[str, str, str]:
    """A short volume entry's source, target and options, its variables at their defaults."""
    entry = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", entry)
    source, target, *options = entry.split(":")
    return source, target, options[0] if options else ""


# --- the shipped files, read without running anything ------------------------------------------

def test_compose_file_watches_the_host_read_only_and_keeps_the_socket_out_of_sparkops():
    compose = _compose()
    service = compose["services"]["sparkops"]
    volumes = [_volume_parts(entry) for entry in service["volumes"]]

    assert service["pid"] == "host" and service["cgroup"] == "host"
    assert service["network_mode"] == "host"
    assert ("/proc", "/host/proc", "ro") in volumes
    assert service["environment"]["SPARKOPS_PROCFS"] == "/host/proc"
    assert ("/sys/fs/cgroup", "/sys/fs/cgroup", "ro") in volumes
    assert ("sparkops-data", "/var/lib/sparkops", "") in volumes
    assert "sparkops-data" in compose["volumes"]
    assert service["user"] == f"{SPARKOPS_UID}:{SPARKOPS_UID}"
    assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in service["security_opt"]
    assert service["image"] == f"localhost/sparkops:{VERSION}"
    assert service["environment"]["SPARKOPS_BIND"] == "${SPARKOPS_BIND:-127.0.0.1:8470}"
    gpu = service["deploy"]["resources"]["reservations"]["devices"]
    assert gpu == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    # The container engine's socket is the proxy's alone; SparkOps talks to the proxy's socket.
    for source, target, _ in volumes:
        assert not source.endswith(".sock") and not target.endswith(".sock"), source
    assert service["environment"]["SPARKOPS_DOCKER_HOST"] == (
        "unix:///run/sparkops-docker/docker.sock")
    proxy = compose["services"]["docker-proxy"]
    proxy_volumes = [_volume_parts(entry) for entry in proxy["volumes"]]
    assert ("/var/run/docker.sock", "/var/run/docker.sock", "") in proxy_volumes
    assert proxy["network_mode"] == "none" and proxy["cap_drop"] == ["ALL"]


def test_compose_file_uses_the_proxy_configuration_as_shipped():
    proxy = _compose()["services"]["docker-proxy"]
    config = PROXY_CONFIG.read_text()
    mounted = {target: source for source, target, _ in map(_volume_parts, proxy["volumes"])}

    assert mounted[proxy["entrypoint"][-1]] == "./deploy/docker-proxy/haproxy.cfg"
    # The variables compose sets are the ones the configuration reads.
    for name in proxy["environment"]:
        assert f"presetenv {name} " in config, name
    bind = proxy["environment"]["SPARKOPS_PROXY_BIND"].split()
    assert bind[0] == "unix@/run/sparkops-docker/docker.sock" and bind[1:] == ["mode", "660"]
    assert proxy["user"] == f"0:{SPARKOPS_UID}"  # the socket's group is SparkOps'


def test_dockerfile_builds_from_the_lock_as_an_unprivileged_user():
    text = DOCKERFILE.read_text()

    assert "ARG BASE=docker.io/library/python:3.12-slim-bookworm\nFROM ${BASE}" in text
    assert "--require-hashes" in text and "-r /opt/sparkops/app/requirements.lock" in text
    assert "USER sparkops:sparkops" in text and "--uid \"${SPARKOPS_UID}\"" in text
    assert f"ARG SPARKOPS_UID={SPARKOPS_UID}" in text
    assert 'VOLUME ["/var/lib/sparkops"]' in text and "EXPOSE 8470" in text
    assert 'CMD ["/opt/sparkops/app/bin/sparkops", "start"]' in text
    assert "/healthz" in _healthcheck_argv()[-1]


# --- the image's health check, run against real servers -----------------------------------------

def _healthcheck_argv() -> list[str]:
    """The Dockerfile's HEALTHCHECK command (its exec form, as JSON, continued lines joined as
    the builder joins them)."""
    text = DOCKERFILE.read_text().replace("\\\n", "")
    found = re.search(r"^HEALTHCHECK .*?CMD (\[.*\])$", text, re.MULTILINE)
    assert found, "the Dockerfile has no HEALTHCHECK in exec form"
    return json.loads(found.group(1))


class _Answer(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 - the standard library's name
        self.server.paths.append(self.path)
        self.send_response(self.server.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def _answering(status: int) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    server.status, server.paths = status, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _health(bind: str) -> int:
    argv = [sys.executable, *_healthcheck_argv()[1:]]
    return subprocess.run(argv, env={"SPARKOPS_BIND": bind}, capture_output=True,
                          timeout=30).returncode


@pytest.mark.slow
def test_healthcheck_asks_the_bind_address_and_fails_on_errors_or_silence():
    for status, healthy in ((200, True), (400, True), (503, False)):
        with _answering(status) as server:
            port = server.server_address[1]
            # A wildcard bind is asked on loopback; a named address on that address.
            assert (_health(f"0.0.0.0:{port}") == 0) is healthy, status
            assert (_health(f"127.0.0.1:{port}") == 0) is healthy, status
            assert server.paths == ["/healthz", "/healthz"]
    assert _health(f"127.0.0.1:{free_port()}") != 0  # nothing listens


# --- the image, built and run --------------------------------------------------------------------

def _mounts_below(folder: Path) -> list[str]:
    prefix = f"{folder}/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if point.startswith(prefix):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def _unmount_below(folder: Path) -> list[str]:
    """Unmount what is mounted below ``folder`` (a debootstrap target's /proc or /sys, a bind
    of the host's /dev); what is still mounted afterwards. Nothing below a mount is deleted."""
    for point in _mounts_below(folder):
        subprocess.run(["umount", "--lazy", point], capture_output=True, timeout=30)
    return _mounts_below(folder)


def _base_cache_path() -> Path:
    """The cached base's tar: the release and a hash of what debootstrap is given (its
    arguments, the mirror and this machine's architecture) in the name."""
    architecture = subprocess.run(["dpkg", "--print-architecture"], capture_output=True,
                                  text=True, timeout=30).stdout.strip() or os.uname().machine
    made_by = json.dumps([*DEBOOTSTRAP, DEBIAN_MIRROR, architecture])
    return TEST_CACHE / (f"debootstrap-{BASE_RELEASE}-"
                         f"{hashlib.sha256(made_by.encode()).hexdigest()[:16]}.tar")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _usable(tar: Path) -> bool:
    """Whether the cached base is there, young enough and exactly the file written."""
    checksum = tar.with_name(tar.name + ".sha256")
    try:
        young = time.time() - tar.stat().st_mtime < BASE_MAX_AGE_DAYS * 86400
        recorded = checksum.read_text().strip()
    except FileNotFoundError:
        return False
    return young and recorded == _sha256(tar)


def _write_atomically(target: Path, write) -> None:
    """``write(file)`` into a temporary file beside ``target``, synced, then renamed over it:
    a reader finds the old file, the new one or none, never a part."""
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with temporary.open("wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        temporary.chmod(0o600)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _make_base(tar: Path, work: Path) -> None:
    """debootstrap a root under ``work``, kept as ``tar`` (with its sha256) in the cache; older
    bases of other names are removed from it."""
    root = work / "root"
    made = subprocess.run([*DEBOOTSTRAP, str(root), DEBIAN_MIRROR], capture_output=True,
                          text=True, timeout=900)
    if made.returncode != 0:
        pytest.fail(f"debootstrap could not make the base: {made.stdout[-1500:]}"
                    f"{made.stderr[-1500:]}")
    if _unmount_below(root):
        pytest.fail(f"debootstrap left mounts below {root}: {_mounts_below(root)}")
    digest = hashlib.sha256()

    def archive(file) -> None:
        with subprocess.Popen(["tar", "-C", str(root), "-c", "."],
                              stdout=subprocess.PIPE) as packing:
            while chunk := packing.stdout.read(1 << 20):
                digest.update(chunk)
                file.write(chunk)
        if packing.returncode != 0:
            pytest.fail(f"tar of the debootstrap root failed ({packing.returncode})")

    TEST_CACHE.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The tar, then its checksum: a reader in between finds the two disagreeing and makes a
    # base of its own.
    _write_atomically(tar, archive)
    _write_atomically(tar.with_name(tar.name + ".sha256"),
                      lambda file: file.write(f"{digest.hexdigest()}\n".encode()))
    shutil.rmtree(root, ignore_errors=True)
    for old in TEST_CACHE.glob(f"debootstrap-{BASE_RELEASE}-*.tar*"):
        if old.name not in (tar.name, tar.name + ".sha256"):
            old.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def image_podman() -> Iterator[PrivatePodman]:
    """A private Podman holding the local base image (Debian bookworm by debootstrap, taken
    from the cache when it is usable there, made and cached otherwise); destroyed with every
    image, container and volume in it at the end."""
    for tool in ("podman", "debootstrap"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is not installed (Debian package {tool})")
    work = Path(tempfile.mkdtemp(prefix="sparkops-image-"))
    private = PrivatePodman(work / "podman")
    try:
        tar = _base_cache_path()
        if not _usable(tar):
            _make_base(tar, work)
        imported = subprocess.run([*private.argv, "import", str(tar), BASE_IMAGE],
                                  capture_output=True, text=True, timeout=300)
        if imported.returncode != 0:
            pytest.fail(f"podman import of the base failed: {imported.stderr.strip()}")
        yield private
    finally:
        problems = []
        try:
            private.destroy()
        except LeftoverError as error:
            problems.append(f"the image's Podman left something behind: {error}")
        mounted = _unmount_below(work)
        if mounted:
            problems.append(f"still mounted, so {work} is kept: {', '.join(mounted)}")
        else:
            shutil.rmtree(work, ignore_errors=True)
        if problems:
            pytest.fail("; ".join(problems))


class ComposeProject:
    """podman-compose on the shipped compose.yaml plus the test override, on ``private``."""

    def __init__(self, private: PrivatePodman, work: Path, env: dict[str, str]) -> None:
        executable = Path(sys.executable).with_name("podman-compose")
        if not executable.exists():
            pytest.fail("podman-compose is not installed in this venv (requirements.txt)")
        self.private = private
        self.argv = [str(executable), f"--podman-args={shlex.join(private.argv[1:])}",
                     "-p", f"sparkops-test-{uuid.uuid4().hex[:8]}",
                     "-f", str(COMPOSE_FILE), "-f", str(TEST_OVERRIDE)]
        self.env = {**os.environ, **env}
        self.log = work / "compose.log"

    def __call__(self, *args: str, options: tuple[str, ...] = (), timeout: float = 300) -> str:
        """``podman-compose [options] <args>``, its output logged; AssertionError on failure."""
        with self.log.open("a") as log:
            log.write(f"$ podman-compose {' '.join([*options, *args])}\n")
        result = subprocess.run([*self.argv, *options, *args], cwd=PROJECT, env=self.env,
                                capture_output=True, text=True, timeout=timeout)
        with self.log.open("a") as log:
            log.write(result.stdout + result.stderr)
        if result.returncode != 0:
            raise AssertionError(f"podman-compose {args[0]} failed ({result.returncode}): "
                                 f"{(result.stdout + result.stderr)[-3000:]}")
        return result.stdout

    def container(self, service: str) -> str:
        found = self.private("ps", "--all", "--quiet", "--filter",
                             f"label=com.docker.compose.service={service}")
        assert found, f"compose started no container for {service}"
        return found.split()[0]

    def logs(self, service: str) -> str:
        with contextlib.suppress(PodmanError):
            return self.private("logs", "--tail", "60", self.container(service))[-4000:]
        return ""


@pytest.fixture
def compose(image_podman: PrivatePodman, docker_host: str, tmp_path: Path
            ) -> Iterator[tuple[ComposeProject, dict[str, str]]]:
    """The compose project, with its settings file and addresses; brought down with its
    volumes and images afterwards, pass or fail."""
    port = free_port()
    node = f"container-{uuid.uuid4().hex[:6]}"
    env_file = tmp_path / "sparkops.env"
    env_file.write_text(f"SPARKOPS_ADMIN_PASSWORD={PASSWORD}\nSPARKOPS_NODE_NAME={node}\n"
                        f"SPARKOPS_EXPORT_TOKEN={EXPORT_TOKEN}\n")
    settings = {"SPARKOPS_ENV_FILE": str(env_file), "SPARKOPS_BIND": f"127.0.0.1:{port}",
                "SPARKOPS_ENGINE_SOCKET": str(SESSION_PODMAN.socket),
                "SPARKOPS_TEST_PROXY_IMAGE": BASE_IMAGE}
    project = ComposeProject(image_podman, tmp_path, settings)
    try:
        yield project, {"port": str(port), "node": node}
    finally:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            # Nothing is checked after this: the containers need no grace to stop (the test
            # base's HAProxy outwaits any, and would hold this up for the whole of it).
            project("down", "--volumes", "--timeout", "1", timeout=180)
        image = _compose()["services"]["sparkops"]["image"]
        with contextlib.suppress(PodmanError):
            image_podman("rm", "--force", "--all", "--time", "0", timeout=120)
            image_podman("volume", "prune", "--force", timeout=60)
            image_podman("rmi", "--force", image, timeout=120)


def _build_home(work: Path) -> Path:
    """A home for root in the build's RUN steps, mounted over /root: pip's configuration there
    trusts this machine's certificate store (the way out to the package index here). Mounted,
    so nothing of it ends up in the image."""
    home = work / "build-root-home"
    (home / ".config" / "pip").mkdir(parents=True)
    if HOST_CA_BUNDLE.exists():
        shutil.copy(HOST_CA_BUNDLE, home / "ca.crt")
        (home / ".config" / "pip" / "pip.conf").write_text("[global]\ncert = /root/ca.crt\n")
    return home


def _poll(read, done, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen within {seconds:.0f} s; last: {value}")
        time.sleep(1)


def _process_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_image_builds_and_its_compose_service_shows_the_hosts_memory(compose, tmp_path):
    project, where = compose
    base, node = f"http://127.0.0.1:{where['port']}", where["node"]
    engine_port = free_port()
    engine = unique_name("gemma")
    run_container(engine, [
        VLLM, "serve", "nvidia/Gemma-4-26B-A4B-NVFP4", "--port", str(engine_port),
        "--served-model-name", "gemma", "--kv-cache-memory-bytes", "96M",
        "--max-num-seqs", "16", "--emulator-weights-bytes", "32M",
        "--emulator-load-seconds", "0.3", "--emulator-profile-seconds", "0.3",
        "--emulator-graph-seconds", "0.3", "--emulator-load", "4:200:40",
        "--emulator-stats-interval", "1",
    ], labels={"sparkops.engine": "vllm"})

    # The docker format keeps the HEALTHCHECK (OCI images have none).
    build = shlex.join(["--format", "docker", "--network", "host",
                        "--build-arg", f"BASE={BASE_IMAGE}",
                        "--volume", f"{_build_home(tmp_path)}:/root"])
    project("build", options=(f"--podman-build-args={build}",), timeout=900)
    project("up", "--detach", "--no-build")
    try:
        wait_for_port(int(where["port"]), timeout=240)
    except TimeoutError:
        raise AssertionError(f"SparkOps did not listen: {project.logs('sparkops')}") from None

    # Logged in over HTTP, the overview's figures are live samples of this machine's memory.
    session = sign_in(base, PASSWORD, node=node)
    headroom = _poll(lambda: session.get(f"{base}/api/nodes/{node}/headroom.json",
                                         timeout=10).json(),
                     lambda data: {f["key"]: f for f in data["figures"]}["mem_available"][
                         "value"] is not None, 60, "a live sample")
    assert headroom["last_ok"] is True and headroom["stale"] is False
    assert headroom["mem_total_gib"] == round(_host_mem_total_bytes() / GIB, 2)
    exports = {"Authorization": f"Bearer {EXPORT_TOKEN}"}
    watched = requests.get(f"{base}/api/v1/nodes", headers=exports, timeout=10).json()
    assert [n["mem_total_bytes"] for n in watched["nodes"] if n["name"] == node] == [
        _host_mem_total_bytes()]

    # Beside the engines: found through the proxy, its memory read from the host's cgroups
    # (by its host PID) and its metrics scraped on the host's loopback.
    def engine_card():
        cards = requests.get(f"{base}/api/v1/nodes/{node}/engines", headers=exports,
                             timeout=10).json()["engines"]
        return next((card for card in cards if card["name"] == engine), None)

    card = _poll(engine_card, lambda card: card is not None and card["phase"] == "ready"
                 and card["decode_tps"] and card["memory_gib"] is not None, 90,
                 "the emulated engine, ready with its rates and memory")
    assert card["scrape_up"] is True and card["scrape_error"] == ""
    assert card["memory_gib"] * GIB >= (96 + 32 - 8) * MIB

    # As configured: uid 10001 and no capabilities, seen from the host; the image's own health
    # check passes.
    pid = int(project.private("inspect", "--format", "{{.State.Pid}}",
                              project.container("sparkops")))
    status = _process_status(pid)
    assert status["Uid"].split()[:2] == [str(SPARKOPS_UID)] * 2
    assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0
    checked = subprocess.run([*project.private.argv, "healthcheck", "run",
                              project.container("sparkops")], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The host's PID namespace: this test's own process is there by its host PID (the ledger's
    # "everything else", NVML's PIDs and the engines' process trees are read that way).
    seen = project.private("exec", project.container("sparkops"), "cat",
                           f"/proc/{os.getpid()}/cmdline")
    assert seen == Path(f"/proc/{os.getpid()}/cmdline").read_text()
