"""The one seam to the container engine, through the Docker Engine API.

Works unchanged against Docker and against Podman's Docker-compatible service. The socket comes
from ``SPARKOPS_DOCKER_HOST``, else ``DOCKER_HOST``, else the Docker default. Every call has a
timeout; a missing or dead engine raises :class:`ContainerEngineError` with the reason.

Cost per collection: one list call, then an inspect only for containers that may have changed
since they were last inspected, and a container's memory read from its cgroup file. An inspect
is reused while the container's first process is the same one (same PID and kernel start time,
checked in ``/proc``, in the container's cgroup) and the list shows the same state and name: a
restart, a stop, a pause or a rename is seen there and inspected again. Where ``/proc`` or the
cgroup files do not show the container (another PID or cgroup namespace), every container is
inspected and its memory comes from the engine's stats call, as before. The API version is
negotiated once per address and kept while the engine answers; the periodic collection keeps its
client too (:func:`kept_client`), and on a Unix socket makes the list call on a connection of its
own kept open (:func:`_list_containers`), the same request docker-py makes.

The calls it makes are few and fixed (list, inspect, logs, stats; stop and start for planned
restarts; create, rename and remove only for a planned restart that recreates its container with
new flags, :func:`recreate_with_command`), so the socket can sit behind a proxy that allows only
those (``deploy/docker-proxy/haproxy.cfg``). In read-only mode (``SPARKOPS_READ_ONLY``) stop,
start and recreation are refused here, before the engine is asked, whoever calls them.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import docker
import docker.errors
import docker.utils
import requests.exceptions
import urllib3.exceptions
from django.conf import settings

from collectors.kinds.discovery import kind_of
from collectors.procfs import container_cgroups, process_start_time
from sparkops.install import PROXY_SOCKET_URL

URL_LABEL = "sparkops.url"
API_TIMEOUT_SECONDS = 10


class ContainerEngineError(Exception):
    """The container engine could not be reached or answered with an error."""


class ReadOnlyRefused(ContainerEngineError):
    """SparkOps is in read-only mode: a container was not stopped or started, and the engine
    was not asked."""


# What read-only mode is, in the words every refusal uses (pages and planning too).
READ_ONLY_TEXT = ("SparkOps is read-only (SPARKOPS_READ_ONLY is on): it monitors and never stops "
                  "or starts a container or drops the page cache")


def read_only() -> bool:
    """Is SparkOps in read-only mode (``SPARKOPS_READ_ONLY``)?"""
    return bool(settings.SPARKOPS_READ_ONLY)


# Where an error said in words is followed by the library's own reason, for whoever debugs it.
DETAIL_SEPARATOR = "\nDetail: "


def _unreachable(url: str | None, error: Exception) -> ContainerEngineError:
    """The error for an engine that cannot be reached, in words: what is wrong at which
    address and what to set, then the library's reason after ``DETAIL_SEPARATOR``."""
    where = url or "Docker's default socket (unix:///var/run/docker.sock)"
    raw = str(error)
    if "Permission denied" in raw or "PermissionError" in raw:
        problem = "the user SparkOps runs as may not use the socket"
    elif "No such file" in raw or "FileNotFoundError" in raw:
        problem = "there is no socket there"
    elif "refused" in raw:
        problem = "nothing answers there"
    else:
        problem = "it did not answer"
    return ContainerEngineError(
        f"Cannot reach the container engine at {where}: {problem}. Set SPARKOPS_DOCKER_HOST to "
        "the Docker or Podman socket (e.g. unix:///var/run/docker.sock) and give the user "
        f"SparkOps runs as read and write access to it.{DETAIL_SEPARATOR}{raw}")


@dataclass(frozen=True)
class Mount:
    type: str
    source: str
    destination: str
    read_write: bool


@dataclass(frozen=True)
class EngineContainer:
    """What the container engine says about one engine container."""

    id: str
    name: str
    image: str
    state: str
    started_at: datetime | None
    restart_count: int
    exit_code: int | None
    pid: int | None
    command: list[str]
    env: dict[str, str]
    labels: dict[str, str]
    mounts: list[Mount]
    network_mode: str
    # container port ("8000/tcp") -> host port published for it
    published_ports: dict[str, int] = field(default_factory=dict)
    memory_usage_bytes: int | None = None
    # The kernel's OOM killer ended it. On GB10 running out usually wedges the host instead, so
    # False proves little; True is worth saying.
    oom_killed: bool = False
    # Started with a terminal: its logs come as one raw stream, not in stdout/stderr frames.
    tty: bool = False
    # Which engine it runs (collectors.kinds): "vllm", "llamacpp", "ollama", …
    kind: str = "vllm"

    @property
    def running(self) -> bool:
        return self.state == "running"


# API version negotiated per engine address ("" for the default socket), so that a client made
# for every collection does not ask the engine for its version each time. Forgotten when the
# engine fails a call (it may have been upgraded or replaced).
_api_versions: dict[str, str] = {}


def client(base_url: str | None = None) -> docker.DockerClient:
    url = base_url or os.environ.get("SPARKOPS_DOCKER_HOST") or os.environ.get("DOCKER_HOST")
    version = _api_versions.get(url or "", "auto")
    try:
        if url:
            made = docker.DockerClient(base_url=url, timeout=API_TIMEOUT_SECONDS, version=version)
        else:
            made = docker.from_env(timeout=API_TIMEOUT_SECONDS, version=version)
    except docker.errors.DockerException as error:
        _api_versions.pop(url or "", None)
        raise _unreachable(url, error) from None
    _api_versions[url or ""] = made.api.api_version
    if made.api.base_url.startswith("http+docker://"):
        # A Unix socket: proxy variables and .netrc never apply, and requests would otherwise
        # scan the whole environment for them on every call.
        made.api.trust_env = False
    return made


# The collection's clients, one per engine address, kept between collections in this process:
# making one for every collection, and opening its first connection to the engine, cost more
# CPU than the list call it was made for. Forgotten when a discovery fails (as the negotiated
# versions are), so the next collection starts anew; a forked child starts its own.
_kept_clients: dict[str, docker.DockerClient] = {}
_kept_lock = threading.Lock()


def kept_client(base_url: str | None = None) -> docker.DockerClient:
    """:func:`client` for the periodic collection, made once per address in this process and
    then reused: not to be closed by the caller. Raises ContainerEngineError as :func:`client`
    does when one has to be made."""
    url = base_url or os.environ.get("SPARKOPS_DOCKER_HOST") or os.environ.get("DOCKER_HOST")
    with _kept_lock:
        kept = _kept_clients.get(url or "")
        if kept is None:
            kept = _kept_clients[url or ""] = client(url)
        return kept


def _forget_kept_clients() -> None:
    with _kept_lock:
        forgotten = list(_kept_clients.values())
        _kept_clients.clear()
    for kept in forgotten:
        kept.close()


def engine_kind(attrs: dict) -> str | None:
    """The engine kind an inspected container runs (``collectors.kinds.kind_of``: the label
    ``sparkops.engine=<kind>`` first, ``none`` to opt out, then its command, then its image),
    or None when it is not an engine."""
    config = attrs.get("Config") or {}
    command = [attrs.get("Path") or "", *(attrs.get("Args") or [])]
    return kind_of(config.get("Labels") or {}, command, config.get("Image") or "")


def is_vllm_engine(attrs: dict) -> bool:
    """A vLLM engine: labelled ``sparkops.engine=vllm``, or running vLLM by command or image."""
    return engine_kind(attrs) == "vllm"


LABEL_SELECTOR_ENV = "SPARKOPS_ENGINE_LABEL_SELECTOR"


def label_selector() -> list[str]:
    """The labels a container must carry to be one of this node's engines:
    ``SPARKOPS_ENGINE_LABEL_SELECTOR``, comma-separated ``key=value`` (that value) or ``key``
    (any value), all of them; empty (every container) when unset.

    For one container engine shared by several SparkOps nodes (one host running the
    containers of several logical nodes, or a test that plays two nodes on one machine): each
    node's worker sets its own selector and lists only its own containers. The container engine
    applies it (the list call's ``label`` filter), so the other containers are never inspected.
    A selector that names no label is refused with the reason, as the engine's own error is.
    """
    text = os.environ.get(LABEL_SELECTOR_ENV, "").strip()
    if not text:
        return []
    items = [item.strip() for item in text.split(",")]
    bad = [item for item in items if not item or not item.partition("=")[0].strip()]
    if bad:
        raise ContainerEngineError(
            f"{LABEL_SELECTOR_ENV}={text!r} is not a list of labels: write key=value or key, "
            "separated by commas (e.g. sparkops.node=spark-b)")
    return [f"{key.strip()}{sep}{value.strip()}"
            for key, sep, value in (item.partition("=") for item in items)]


def discover_engines(engine: docker.DockerClient, *, proc_root: Path = Path("/proc"),
                     cgroup_root: Path = Path("/sys/fs/cgroup")) -> list[EngineContainer]:
    """Every engine container on this engine, of every kind, running or not, with memory for
    running ones.

    ``proc_root`` and ``cgroup_root`` are where this host's processes and cgroups are seen.
    Only containers whose labels match ``SPARKOPS_ENGINE_LABEL_SELECTOR`` are listed, when it
    is set (:func:`label_selector`).
    """
    global _memory_cgroups
    selector = label_selector()
    try:
        listed = _list_containers(engine, selector)
        found = []
        running_cgroups: dict[str, Path | None] = {}
        for summary in listed:
            seen = _inspect(engine, summary, _inspected.get(summary["Id"]), proc_root)
            _inspected[summary["Id"]] = seen
            kind = engine_kind(seen.attrs)
            # An old container kept while its replacement starts is not an engine of its own.
            if kind is not None and not is_replaced_name(seen.attrs.get("Name") or ""):
                memory = None
                if (seen.attrs.get("State") or {}).get("Status") == "running":
                    memory = _cgroup_memory(seen.memory_file, cgroup_root)
                    running_cgroups[summary["Id"]] = _cgroup_dir(seen.memory_file, cgroup_root)
                    if memory is None:
                        memory = _memory_usage(engine, seen.attrs["Id"])
                found.append(_engine_container(seen.attrs, memory, kind))
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        _api_versions.clear()
        _inspected.clear()
        _memory_cgroups = {}
        _forget_kept_clients()
        raise ContainerEngineError(f"container engine error: {error}") from None
    for gone in _inspected.keys() - {summary["Id"] for summary in listed}:
        _inspected.pop(gone, None)
    _memory_cgroups = running_cgroups  # one assignment: a reader never sees half of it
    return found


def _list_containers(engine: docker.DockerClient, selector: list[str]) -> list[dict]:
    """Every container, running or not, with the labels of ``selector``: docker-py's
    ``containers(all=True, filters={"label": selector})``.

    Over a Unix socket the call is made with ``http.client`` on a connection kept between
    collections (:func:`_listed_over_socket`): through requests and urllib3 it cost about three
    times the CPU, every collection. Anything unexpected there is asked again through docker-py,
    whose answer, or error, is the one that counts.
    """
    filters = {"label": selector} if selector else None
    listed = _listed_over_socket(engine, filters)
    return listed if listed is not None else engine.api.containers(all=True, filters=filters)


class _SocketConnection(http.client.HTTPConnection):
    """An HTTP connection to the container engine's Unix socket."""

    def __init__(self, socket_path: str) -> None:
        super().__init__("localhost", timeout=API_TIMEOUT_SECONDS)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


# Socket path -> the connection the list call is made on, kept between collections (a forked
# child makes its own); the lock keeps one request on it at a time.
_list_connections: dict[str, _SocketConnection] = {}
_list_lock = threading.Lock()


def _listed_over_socket(engine: docker.DockerClient, filters: dict | None) -> list[dict] | None:
    """The list call of docker-py's ``containers()`` (its path, query and User-Agent) made with
    ``http.client``; None where it is not made so (not a Unix socket, extra HTTP headers set in
    the Docker CLI's config.json, which docker-py adds to every call) or did not give a list of
    containers with status 200: the caller then asks docker-py."""
    api = engine.api
    adapters = getattr(api, "adapters", None)
    socket_path = getattr(adapters.get("http+docker://"), "socket_path", None) \
        if isinstance(adapters, dict) else None
    general = getattr(api, "_general_configs", None)
    if not isinstance(socket_path, str) or not isinstance(general, dict) \
            or "HttpHeaders" in general:
        return None
    # docker-py's parameters, in its order (docker/api/container.py, containers()).
    query = {"limit": -1, "all": 1, "size": 0, "trunc_cmd": 0}
    if filters:
        query["filters"] = docker.utils.convert_filters(filters)
    target = f"/v{api.api_version}/containers/json?{urllib.parse.urlencode(query)}"
    headers = {"User-Agent": str(api.headers.get("User-Agent", ""))}
    with _list_lock:
        for _attempt in range(2):  # an idle kept connection may have been closed by the engine
            connection = _list_connections.get(socket_path)
            reused = connection is not None
            if connection is None:
                connection = _list_connections[socket_path] = _SocketConnection(socket_path)
            try:
                connection.request("GET", target, headers=headers)
                response = connection.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException):
                connection.close()
                _list_connections.pop(socket_path, None)
                if reused:
                    continue
                return None
            if response.status != 200 or response.will_close:
                connection.close()
                _list_connections.pop(socket_path, None)
            if response.status != 200:
                return None
            try:
                listed = json.loads(body)
            except ValueError:
                return None
            fine = isinstance(listed, list) and all(
                isinstance(summary, dict) and "Id" in summary for summary in listed)
            return listed if fine else None
    return None


def _forget_connections_after_fork() -> None:
    """A forked child's: the parent's kept clients and connections are not its to use or close."""
    global _kept_clients, _kept_lock, _list_connections, _list_lock
    _kept_clients, _kept_lock = {}, threading.Lock()
    _list_connections, _list_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_connections_after_fork)


# container id -> the directory of its memory cgroup, for the engines the last discovery in this
# process found running (None where /proc or the cgroup files do not show it)
_memory_cgroups: dict[str, Path | None] = {}


def memory_cgroup(container_id: str) -> Path | None:
    """The directory of the cgroup a running engine container's memory is counted in, as the
    last discovery in this process found it: its first process was seen in ``/proc`` inside
    that cgroup. None when no discovery here found it running, or where the cgroup files do not
    show it (another cgroup namespace). The ledger lists the container's processes from it
    instead of reading every process's cgroup file."""
    return _memory_cgroups.get(container_id)


# --- inspecting only what may have changed ----------------------------------------------------


@dataclass(frozen=True)
class _Inspected:
    """A container's inspect, and what must still hold for it to be reused.

    ``listed``: its state and names in the list call; ``process``: the PID and kernel start
    time of its first process, seen in ``/proc`` and in the container's own cgroup (None when
    that could not be checked: the inspect is then never reused); ``memory_file``: its cgroup's
    memory usage file, relative to the cgroup root (None: use the stats call).
    """

    attrs: dict
    listed: tuple
    process: tuple[int, str] | None
    memory_file: str | None


# container id (unique across engines) -> its last inspect
_inspected: dict[str, _Inspected] = {}


def _listed(summary: dict) -> tuple:
    return (summary.get("State"), tuple(summary.get("Names") or ()))


def _inspect(engine: docker.DockerClient, summary: dict, previous: _Inspected | None,
             proc_root: Path) -> _Inspected:
    """The container's inspect: the previous one while nothing can have changed, else anew."""
    listed = _listed(summary)
    if (previous is not None and previous.process is not None and previous.listed == listed
            and process_start_time(previous.process[0], proc_root) == previous.process[1]):
        return previous
    attrs = engine.api.inspect_container(summary["Id"])
    state = attrs.get("State") or {}
    pid = state.get("Pid") or None
    process, memory_file = None, None
    if state.get("Status") == "running" and pid:
        started = process_start_time(pid, proc_root)
        cgroups = container_cgroups(pid, attrs["Id"], proc_root)
        if started is not None and cgroups is not None:
            process, memory_file = (pid, started), _memory_file(cgroups)
    return _Inspected(attrs=attrs, listed=listed, process=process, memory_file=memory_file)


def _memory_file(cgroups: dict[str, str]) -> str | None:
    """The file whose value the engine's stats call reports as memory usage: cgroup v1's
    ``memory.usage_in_bytes`` when the memory controller is a v1 one, else v2's
    ``memory.current``."""
    if "memory" in cgroups:
        return f"memory/{cgroups['memory']}/memory.usage_in_bytes"
    if "" in cgroups:
        return f"{cgroups['']}/memory.current"
    return None


def _cgroup_dir(memory_file: str | None, cgroup_root: Path) -> Path | None:
    """The cgroup directory that holds ``memory_file`` (:func:`_memory_file`)."""
    return None if memory_file is None else (cgroup_root / memory_file).parent


def _cgroup_memory(memory_file: str | None, cgroup_root: Path) -> int | None:
    if memory_file is None:
        return None
    try:
        return int((cgroup_root / memory_file).read_text())
    except (OSError, ValueError):
        return None


def _engine_container(attrs: dict, memory_usage_bytes: int | None,
                      kind: str = "vllm") -> EngineContainer:
    state = attrs.get("State") or {}
    config = attrs.get("Config") or {}
    host_config = attrs.get("HostConfig") or {}
    running = state.get("Status") == "running"
    return EngineContainer(
        id=attrs["Id"],
        name=(attrs.get("Name") or "").lstrip("/"),
        image=config.get("Image") or attrs.get("ImageName") or "",
        state=state.get("Status") or "unknown",
        started_at=parse_docker_time(state.get("StartedAt")),
        restart_count=int(attrs.get("RestartCount") or 0),
        exit_code=None if running else state.get("ExitCode"),
        pid=state.get("Pid") or None,
        command=[attrs.get("Path") or "", *(attrs.get("Args") or [])],
        env=dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item),
        labels=dict(config.get("Labels") or {}),
        mounts=[
            Mount(
                type=m.get("Type", ""), source=m.get("Source", ""),
                destination=m.get("Destination", ""), read_write=bool(m.get("RW", True)),
            )
            for m in attrs.get("Mounts") or []
        ],
        network_mode=host_config.get("NetworkMode") or "",
        published_ports=_published_ports(attrs),
        memory_usage_bytes=memory_usage_bytes if running else None,
        oom_killed=bool(state.get("OOMKilled")),
        tty=bool(config.get("Tty")),
        kind=kind,
    )


def _published_ports(attrs: dict) -> dict[str, int]:
    ports = ((attrs.get("NetworkSettings") or {}).get("Ports")) or {}
    published: dict[str, int] = {}
    for container_port, bindings in ports.items():
        for binding in bindings or []:
            if binding.get("HostPort"):
                published[container_port] = int(binding["HostPort"])
                break
    return published


def _memory_usage(engine: docker.DockerClient, container_id: str) -> int | None:
    """The container's cgroup memory. GPU allocations are NOT charged here on GB10."""
    try:
        stats = engine.api.stats(container_id, stream=False, one_shot=True)
    except (docker.errors.DockerException, requests.exceptions.RequestException):
        return None
    usage = (stats.get("memory_stats") or {}).get("usage")
    return int(usage) if usage is not None else None


def parse_docker_time(value: str | None) -> datetime | None:
    """Docker's RFC 3339 times with nanoseconds; the zero time means "never"."""
    if not value or value.startswith("0001-01-01"):
        return None
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", value)
    if not match:
        return None
    fraction = (match.group(2) or ".0")[:7]
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    return datetime.fromisoformat(f"{match.group(1)}{fraction}{zone}")


def metrics_base_url(container: EngineContainer, port: int) -> str | None:
    """Where the engine's HTTP API answers, as seen from this host.

    The ``sparkops.url`` label wins; host networking means loopback on the engine's ``--port``;
    otherwise the host port published for it. None when the API is not reachable from here.
    """
    if container.labels.get(URL_LABEL):
        return container.labels[URL_LABEL].rstrip("/")
    if container.network_mode == "host":
        return f"http://127.0.0.1:{port}"
    published = container.published_ports.get(f"{port}/tcp")
    return f"http://127.0.0.1:{published}" if published else None


# --- the verbs a planned restart uses ------------------------------------------------------------
# SparkOps stops and starts engine containers; the one other change it makes is replacing an
# engine's container by one with another command, for a plan that asks it (the next section). No
# exec or kill. These functions do not know which containers may be touched; the runbook checks
# the engine's ``manageable`` flag (and audits) before it calls them. They refuse in read-only
# mode.

STOP_TIMEOUT_SECONDS = 30


@dataclass(frozen=True)
class ContainerStatus:
    """A container's state as the engine reports it now. A container that no longer exists is
    ``exists=False`` (state "gone"), not an error."""

    state: str
    running: bool
    started_at: datetime | None
    exit_code: int | None
    oom_killed: bool
    pid: int | None
    exists: bool = True
    finished_at: datetime | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, times as ISO 8601 (what a restart records as ``container_state``)."""
        return {
            "state": self.state,
            "running": self.running,
            "exists": self.exists,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "exit_code": self.exit_code,
            "oom_killed": self.oom_killed,
            "pid": self.pid,
        }


GONE = ContainerStatus(state="gone", running=False, started_at=None, exit_code=None,
                       oom_killed=False, pid=None, exists=False)


def container_status(engine: docker.DockerClient, container_id: str) -> ContainerStatus:
    """Inspect one container. Raises :class:`ContainerEngineError` when the engine cannot say."""
    try:
        attrs = engine.api.inspect_container(container_id)
    except docker.errors.NotFound:
        return GONE
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise ContainerEngineError(f"cannot inspect {container_id[:12]}: {error}") from None
    state = attrs.get("State") or {}
    running = state.get("Status") == "running"
    return ContainerStatus(
        state=state.get("Status") or "unknown",
        running=running,
        started_at=parse_docker_time(state.get("StartedAt")),
        exit_code=None if running else state.get("ExitCode"),
        oom_killed=bool(state.get("OOMKilled")),
        pid=state.get("Pid") or None,
        finished_at=None if running else parse_docker_time(state.get("FinishedAt")),
    )


def stop_container(engine: docker.DockerClient, container_id: str,
                   timeout_seconds: int = STOP_TIMEOUT_SECONDS) -> None:
    """Stop a container: SIGTERM, then SIGKILL after ``timeout_seconds`` (the engine's own grace).

    Stopping a stopped container succeeds. Blocks up to ``timeout_seconds`` plus the API timeout;
    raises :class:`ContainerEngineError` with the reason (also when the container is gone), and
    :class:`ReadOnlyRefused` in read-only mode.
    """
    _refuse_if_read_only("stop", container_id)
    try:
        engine.api.stop(container_id, timeout=timeout_seconds)
    except docker.errors.NotFound:
        raise ContainerEngineError(f"cannot stop {container_id[:12]}: no such container") from None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise ContainerEngineError(f"cannot stop {container_id[:12]}: {error}") from None


def start_container(engine: docker.DockerClient, container_id: str) -> None:
    """Start an existing, stopped container (never creates one). Starting a running container
    succeeds. Raises :class:`ContainerEngineError` with the reason, and :class:`ReadOnlyRefused`
    in read-only mode."""
    _refuse_if_read_only("start", container_id)
    try:
        engine.api.start(container_id)
    except docker.errors.NotFound:
        raise ContainerEngineError(f"cannot start {container_id[:12]}: no such container") from None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise ContainerEngineError(f"cannot start {container_id[:12]}: {error}") from None


def _refuse_if_read_only(verb: str, container_id: str) -> None:
    if read_only():
        raise ReadOnlyRefused(f"cannot {verb} {container_id[:12]}: {READ_ONLY_TEXT}")


def container_command(engine: docker.DockerClient, container_id: str) -> list[str]:
    """The command a container runs (its entrypoint and arguments, as the engine reports them,
    secrets not masked). Raises :class:`ContainerEngineError` with the reason."""
    try:
        attrs = engine.api.inspect_container(container_id)
    except docker.errors.NotFound:
        raise ContainerEngineError(f"cannot inspect {container_id[:12]}: no such container") \
            from None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise ContainerEngineError(f"cannot inspect {container_id[:12]}: {error}") from None
    return [attrs.get("Path") or "", *(attrs.get("Args") or [])]


# --- recreating a container with another command -------------------------------------------------
# A plan that changes an engine's flags may ask SparkOps to recreate its container (restarts'
# "recreate" mode). The new container keeps everything of the old one but its command: image
# (as the old one names it: a tag pulled anew since then runs the newer image), entrypoint,
# environment, labels, working directory, user, mounts (anonymous volumes are reattached by name,
# so their data stays), network mode, networks and aliases, and the whole host configuration
# (ports, devices, GPU requests, limits, restart policy, cgroup parent). It gets the old name.
#
# The old container is kept until the new one serves: renamed to ``<name>-sparkops-replaced-<id>``
# and stopped. Creating or starting the new one failing puts the old one back under its name at
# once (:func:`recreate_with_command` raises, saying so); a new one that exits while it starts is
# replaced by the old one with :func:`restore_replaced`; once the new one serves,
# :func:`discard_replaced` removes the old one (its volumes are kept). A container created by
# compose is never recreated here: compose would no longer know it.

COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
REPLACED_MARKER = "-sparkops-replaced-"
# Network modes that name no network of their own to rejoin.
_NO_NETWORK_TO_JOIN = ("host", "none", "")


@dataclass(frozen=True)
class Recreated:
    """A container replaced by one with another command: the new one runs under ``name``; the
    old one is kept stopped under ``replaced_name`` until it is discarded or restored."""

    name: str
    container_id: str
    replaced_id: str
    replaced_name: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "container_id": self.container_id,
                "replaced_id": self.replaced_id, "replaced_name": self.replaced_name}


def is_replaced_name(name: str) -> bool:
    """Is ``name`` that of an old container kept while its replacement starts?"""
    return REPLACED_MARKER in name


def recreation_refused() -> str | None:
    """Why no container can be recreated from here, or None: the least-privilege Docker API
    proxy the installer puts in front of the container engine (``--docker-access proxy``,
    deploy/docker-proxy/haproxy.cfg) lets SparkOps read, stop and start containers, never
    create, rename or remove one (creating is as good as root on the host)."""
    url = os.environ.get("SPARKOPS_DOCKER_HOST") or os.environ.get("DOCKER_HOST") or ""
    if url.rstrip("/") != PROXY_SOCKET_URL:
        return None
    return ("SparkOps reaches the container engine through the least-privilege Docker API "
            f"proxy ({PROXY_SOCKET_URL}), which refuses creating, renaming and removing "
            "containers: plan the change as \"note\" and recreate the container yourself, or "
            "install with --docker-access group")


def check_recreatable(engine: docker.DockerClient, container_id: str,
                      command: list[str]) -> None:
    """Raise :class:`ContainerEngineError` saying why the container cannot be recreated with
    ``command`` (the container engine is reached through the least-privilege proxy, the
    container is gone, created by compose, not from an image, or ``command`` does not begin with
    its entrypoint); return None when it can. Only inspects: allowed in read-only mode."""
    refused = recreation_refused()
    if refused:
        raise ContainerEngineError(refused)
    _recreation_body(_inspect_for_recreation(engine, container_id), command)


def recreate_with_command(engine: docker.DockerClient, container_id: str,
                          command: list[str]) -> Recreated:
    """Replace the stopped container ``container_id`` by a new one with ``command`` (the whole
    command line: the container's entrypoint followed by its arguments), as the section above
    says. Cost: an inspect, two renames, a create and a start (a network connect per further
    network). Raises :class:`ContainerEngineError` with the reason, after putting the old
    container back under its name; :class:`ReadOnlyRefused` in read-only mode."""
    _refuse_if_read_only("recreate", container_id)
    attrs = _inspect_for_recreation(engine, container_id)
    if (attrs.get("State") or {}).get("Status") == "running":
        raise ContainerEngineError(f"cannot recreate {container_id[:12]}: it is running; stop "
                                   "it first")
    body, networks = _recreation_body(attrs, command)
    old_id, name = attrs["Id"], (attrs.get("Name") or "").lstrip("/")
    replaced_name = f"{name}{REPLACED_MARKER}{old_id[:12]}"
    try:
        engine.api.rename(old_id, replaced_name)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise ContainerEngineError(f"cannot recreate {name}: renaming the old container "
                                   f"failed: {error}; nothing was changed") from None
    new_id = None
    try:
        new_id = engine.api.create_container_from_config(body, name=name)["Id"]
        for network, endpoint in networks.items():
            engine.api.connect_container_to_network(
                new_id, network, aliases=endpoint.get("Aliases") or None,
                links=endpoint.get("Links") or None,
                ipv4_address=(endpoint.get("IPAMConfig") or {}).get("IPv4Address") or None,
                ipv6_address=(endpoint.get("IPAMConfig") or {}).get("IPv6Address") or None)
        engine.api.start(new_id)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        step = "starting" if new_id else "creating"
        back = _put_back(engine, new_id, old_id, name, replaced_name)
        raise ContainerEngineError(f"cannot recreate {name}: {step} the new container failed: "
                                   f"{_api_reason(error)}; {back}") from None
    return Recreated(name=name, container_id=new_id, replaced_id=old_id,
                     replaced_name=replaced_name)


def restore_replaced(engine: docker.DockerClient, recreated: Recreated) -> None:
    """Undo a recreation: remove the new container (stopping it) and give the old one its name
    back, stopped. Raises :class:`ContainerEngineError` with what is left where, and
    :class:`ReadOnlyRefused` in read-only mode."""
    _refuse_if_read_only("restore", recreated.replaced_id)
    try:
        engine.api.remove_container(recreated.container_id, force=True)
    except docker.errors.NotFound:
        pass
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise ContainerEngineError(
            f"cannot remove the new container {recreated.container_id[:12]}: {error}; the old "
            f"one is kept as {recreated.replaced_name}") from None
    try:
        engine.api.rename(recreated.replaced_id, recreated.name)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise ContainerEngineError(f"cannot rename {recreated.replaced_name} back to "
                                   f"{recreated.name}: {error}") from None


def discard_replaced(engine: docker.DockerClient, recreated: Recreated) -> None:
    """Remove the old container once its replacement serves (its volumes are kept). Gone
    already is fine. Raises :class:`ContainerEngineError` with the reason, and
    :class:`ReadOnlyRefused` in read-only mode."""
    _refuse_if_read_only("remove", recreated.replaced_id)
    try:
        engine.api.remove_container(recreated.replaced_id, v=False, force=False)
    except docker.errors.NotFound:
        return
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise ContainerEngineError(f"cannot remove the old container {recreated.replaced_name}: "
                                   f"{error}") from None


def _inspect_for_recreation(engine: docker.DockerClient, container_id: str) -> dict:
    try:
        return engine.api.inspect_container(container_id)
    except docker.errors.NotFound:
        raise ContainerEngineError(f"cannot recreate {container_id[:12]}: no such container") \
            from None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise ContainerEngineError(f"cannot inspect {container_id[:12]}: {error}") from None


def _recreation_body(attrs: dict, command: list[str]) -> tuple[dict, dict[str, dict]]:
    """The create request of the replacement (the old container's configuration with the new
    arguments) and the further networks to connect it to; raises
    :class:`ContainerEngineError` when the container cannot be recreated."""
    config = dict(attrs.get("Config") or {})
    host_config = dict(attrs.get("HostConfig") or {})
    name = (attrs.get("Name") or "").lstrip("/") or attrs["Id"][:12]
    project = (config.get("Labels") or {}).get(COMPOSE_PROJECT_LABEL)
    if project:
        raise ContainerEngineError(f"cannot recreate {name}: compose project {project} owns it "
                                   f"(label {COMPOSE_PROJECT_LABEL}); recreate it through compose")
    if not config.get("Image"):
        raise ContainerEngineError(f"cannot recreate {name}: it was not created from an image")
    entrypoint = config.get("Entrypoint") or []
    entrypoint = [entrypoint] if isinstance(entrypoint, str) else list(entrypoint)
    if list(command[:len(entrypoint)]) != entrypoint or len(command) <= len(entrypoint):
        raise ContainerEngineError(
            f"cannot recreate {name}: the new command must begin with the container's "
            f"entrypoint ({' '.join(entrypoint)}) and give it arguments")
    config["Cmd"] = list(command[len(entrypoint):])
    network_mode = host_config.get("NetworkMode") or ""
    if config.get("Hostname") == attrs["Id"][:12] or network_mode in _NO_NETWORK_TO_JOIN \
            or network_mode.startswith("container:"):
        config.pop("Hostname", None)  # the engine gives the new one its own (or the host's)
    # Podman reports ulimits by their kernel names (RLIMIT_NOFILE) and expects "nofile" back.
    host_config["Ulimits"] = [{**limit, "Name": limit["Name"].removeprefix("RLIMIT_").lower()}
                              for limit in host_config.get("Ulimits") or []]
    host_config["Binds"] = [*(host_config.get("Binds") or []), *_anonymous_volumes(attrs)]
    networks = _endpoints(attrs)
    primary = "bridge" if network_mode == "default" else network_mode
    body = {**config, "HostConfig": host_config}
    if primary in networks:
        body["NetworkingConfig"] = {"EndpointsConfig": {primary: networks.pop(primary)}}
    return body, networks


def _anonymous_volumes(attrs: dict) -> list[str]:
    """Volumes mounted without a bind entry (anonymous ones, and a ``--mount`` of a volume not
    in ``HostConfig.Mounts``), as ``name:destination[:ro]``, so that the replacement mounts the
    same volumes instead of new empty ones."""
    host_config = attrs.get("HostConfig") or {}
    bound = {entry.split(":")[1] for entry in host_config.get("Binds") or [] if ":" in entry}
    bound |= {mount.get("Target") for mount in host_config.get("Mounts") or []}
    return [f"{m['Name']}:{m['Destination']}{'' if m.get('RW', True) else ':ro'}"
            for m in attrs.get("Mounts") or []
            if m.get("Type") == "volume" and m.get("Name") and m.get("Destination") not in bound]


def _endpoints(attrs: dict) -> dict[str, dict]:
    """The container's networks with what it was given on each (aliases other than its own id,
    static addresses, links); none for host, none or another container's network."""
    network_mode = (attrs.get("HostConfig") or {}).get("NetworkMode") or ""
    if network_mode in _NO_NETWORK_TO_JOIN or network_mode.startswith("container:"):
        return {}
    short_id = attrs["Id"][:12]
    endpoints = {}
    for network, endpoint in ((attrs.get("NetworkSettings") or {}).get("Networks") or {}).items():
        endpoint = endpoint or {}
        endpoints[network] = {
            "Aliases": [a for a in endpoint.get("Aliases") or [] if a != short_id],
            "IPAMConfig": endpoint.get("IPAMConfig") or None,
            "Links": endpoint.get("Links") or None,
        }
    return endpoints


def _put_back(engine: docker.DockerClient, new_id: str | None, old_id: str, name: str,
              replaced_name: str) -> str:
    """After a failed create or start: remove the new container and rename the old one back;
    what became of it, in words."""
    try:
        if new_id:
            engine.api.remove_container(new_id, force=True)
        engine.api.rename(old_id, name)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        return f"the old container could not be put back ({error}): it is kept as {replaced_name}"
    return f"the old container is back under its name {name}, stopped"


def _api_reason(error: Exception) -> str:
    """The engine's own explanation of a refused call, else the error."""
    explanation = getattr(error, "explanation", None)
    return str(explanation or error)


# --- container logs: streamed, capped, continued from a cursor ---------------------------------
# A log is read as the engine streams it (``timestamps=1``, stdout/stderr frames unless the
# container has a terminal) and never held whole: a read takes in at most ``max_bytes`` of new
# output, keeps at most ``max_line_bytes`` of any line (the rest is dropped and the line marked),
# and stops at ``LOG_READ_DEADLINE_SECONDS``. Its cursor says where the next read continues, so
# what was read is not read again. Podman stamps entries with whole seconds and splits long lines
# into 8 KiB entries: the cursor therefore also counts the entries already taken at its
# timestamp, and the next read, which the engine starts at that second, passes over them (up to
# ``LOG_SKIP_MAX_BYTES``; past that the read moves on to the next second and says so).

LOG_READ_MAX_BYTES = 4 * 1024 * 1024
LOG_LINE_MAX_BYTES = 64 * 1024
LOG_SKIP_MAX_BYTES = 64 * 1024 * 1024
LOG_READ_DEADLINE_SECONDS = 10.0
LOG_CHUNK_BYTES = 64 * 1024
_FRAME_HEADER_BYTES = 8
_LOG_STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{1,9})?(Z|[+-]\d\d:\d\d) ")
_STAMP_MAX_BYTES = 40


def cut_mark(max_line_bytes: int) -> str:
    """What ends a line that was cut at ``max_line_bytes``."""
    return f" …[line cut: longer than {max_line_bytes} bytes]"


@dataclass(frozen=True)
class LogCursor:
    """Where a log read stopped: the stamp of the last entry taken (``seconds``/``nanos`` since
    the epoch, ``stamp`` as the engine wrote it) and how many entries with that very stamp were
    taken."""

    stamp: str
    seconds: int
    nanos: int
    taken_at_stamp: int

    def since(self) -> str:
        """The engine's ``since`` parameter that starts at this cursor's entry."""
        return f"{self.seconds}.{self.nanos:09d}"


@dataclass(frozen=True)
class LogRead:
    """One read of a container's log: its complete lines (cut ones marked), the cursor to
    continue from (None: nothing stamped was read, start where this read started), the new
    bytes taken in, the already-read bytes passed over, whether the read stopped before the end
    (cap or deadline: more is waiting), and how many lines were cut."""

    text: str
    cursor: LogCursor | None
    bytes_read: int
    bytes_skipped: int
    capped: bool
    lines_cut: int


def read_logs(engine: docker.DockerClient, container_id: str, *,
              cursor: LogCursor | None = None, since: datetime | None = None, tty: bool = False,
              max_bytes: int = LOG_READ_MAX_BYTES, max_line_bytes: int = LOG_LINE_MAX_BYTES,
              deadline_seconds: float = LOG_READ_DEADLINE_SECONDS) -> LogRead:
    """Read the container's stdout and stderr after ``cursor`` (else from ``since``, else from
    the start), bounded as the section above says. Cost: one streamed logs call; memory bounded
    by ``max_bytes`` plus one line. Raises :class:`ContainerEngineError` with the reason."""
    params: dict[str, object] = {"stdout": 1, "stderr": 1, "timestamps": 1, "follow": 0}
    if cursor is not None:
        params["since"] = cursor.since()
    elif since is not None:
        params["since"] = f"{int(since.timestamp())}.{since.microsecond * 1000:09d}"
    url = f"{engine.api.base_url}/v{engine.api.api_version}/containers/{container_id}/logs"
    try:
        response = engine.api.get(url, params=params, stream=True, timeout=API_TIMEOUT_SECONDS)
        try:
            if response.status_code >= 400:
                reason = response.raw.read(500).decode("utf-8", errors="replace").strip()
                raise ContainerEngineError(f"cannot read logs of {container_id[:12]}: HTTP "
                                           f"{response.status_code} {reason}")
            reader = _LogReader(cursor, max_bytes, max_line_bytes, deadline_seconds)
            return reader.read(_log_entries(response.raw, tty))
        finally:
            response.close()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError,
            urllib3.exceptions.HTTPError, ValueError) as error:
        raise ContainerEngineError(f"cannot read logs of {container_id[:12]}: {error}") from None


def container_logs(engine: docker.DockerClient, container_id: str, *,
                   since: datetime | None = None, tty: bool = False) -> str:
    """The container's output (from ``since`` when given) as one capped read, decoded
    leniently. Raises :class:`ContainerEngineError` with the reason."""
    return read_logs(engine, container_id, since=since, tty=tty).text


def container_logs_since(engine: docker.DockerClient, container_id: str,
                         since: datetime) -> str:
    """The container's output written at or after ``since`` (e.g. its latest start), so that
    lines of an earlier run are not mistaken for the current one; one capped read. Raises
    :class:`ContainerEngineError` with the reason."""
    return container_logs(engine, container_id, since=since)


def _read_exactly(raw, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = raw.read(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


# What _log_entries yields when the stream stopped sending between two entries.
STALLED = object()


def _log_entries(raw, tty: bool):
    """The log's entries, each as a list-like stream of byte chunks: ``None`` starts an entry,
    then its chunks follow. Frames of the multiplexed stream are entries; with a terminal, lines
    are."""
    if tty:
        yield from _tty_entries(raw)
        return
    while True:
        try:
            header = _read_exactly(raw, _FRAME_HEADER_BYTES)
        except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
            # Between two entries, a stream that stops sending (seen with Podman 4.3 behind the
            # proxy) ends this read as capped: the next read goes on from its cursor.
            yield STALLED
            return
        if len(header) < _FRAME_HEADER_BYTES:
            return
        left = int.from_bytes(header[4:8], "big")
        yield None
        while left > 0:
            chunk = raw.read(min(left, LOG_CHUNK_BYTES))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk


def _tty_entries(raw):
    at_start = True
    while chunk := raw.read(LOG_CHUNK_BYTES):
        while chunk:
            if at_start:
                yield None
                at_start = False
            end = chunk.find(b"\n")
            if end < 0:
                yield chunk
                break
            yield chunk[: end + 1]
            chunk = chunk[end + 1 :]
            at_start = True


class _LogReader:
    """Folds a stream of entries into lines, a cursor and counts (see :func:`read_logs`)."""

    def __init__(self, cursor: LogCursor | None, max_bytes: int, max_line_bytes: int,
                 deadline_seconds: float) -> None:
        self.after = cursor
        self.cursor = cursor
        self.max_bytes, self.max_line_bytes = max_bytes, max_line_bytes
        self.deadline = time.monotonic() + deadline_seconds
        self.lines: list[str] = []
        self.line = bytearray()
        self.line_length = 0
        self.read_bytes = self.skipped = self.cut = 0
        self.passed_at_stamp = 0  # entries at the old cursor's stamp passed over so far
        self.stopped_in_line = False  # the read stopped inside an entry: its line is cut

    def read(self, entries) -> LogRead:
        capped = False
        skipping = False
        head: bytes | None = b""
        for chunk in entries:
            if chunk is STALLED:
                capped = True
                break
            if chunk is None:
                if head:  # the last entry was shorter than a stamp: take it as it is
                    self._take(head)
                if self.read_bytes >= self.max_bytes:
                    capped = True
                    break
                skipping, head = False, b""
                continue
            if head is not None:
                head += chunk
                if len(head) < _STAMP_MAX_BYTES and b" " not in head:
                    continue
                entry, skipping = self._begin_entry(head), False
                if entry is None:
                    skipping, entry = True, head
                chunk, head = entry, None
            if skipping:
                self.skipped += len(chunk)
                if self.skipped > LOG_SKIP_MAX_BYTES:
                    self._jump_past_stamp()
                    capped = True
                    break
                continue
            room = self.max_bytes - self.read_bytes
            self._take(chunk[:room])
            if len(chunk) > room or time.monotonic() > self.deadline:
                capped = self.stopped_in_line = True
                break
        if head and not capped:
            self._take(head)
        self._end_line(final=True)
        return LogRead(text="\n".join(self.lines), cursor=self.cursor,
                       bytes_read=self.read_bytes, bytes_skipped=self.skipped, capped=capped,
                       lines_cut=self.cut)

    def _begin_entry(self, head: bytes) -> bytes | None:
        """The entry's content after its stamp; None when it was taken by an earlier read."""
        match = _LOG_STAMP.match(head)
        if match is None:
            return head
        stamp = match.group(0)[:-1].decode()
        parsed = parse_docker_time(stamp)
        if parsed is None:
            return head
        seconds = int(parsed.replace(microsecond=0).timestamp())
        nanos = int(((match.group(2) or b".0")[1:] + b"000000000")[:9])
        if self.after is not None:
            when, before = (seconds, nanos), (self.after.seconds, self.after.nanos)
            if when < before:
                return None
            if stamp == self.after.stamp and self.passed_at_stamp < self.after.taken_at_stamp:
                self.passed_at_stamp += 1
                return None
        taken = self.cursor.taken_at_stamp + 1 if self.cursor and self.cursor.stamp == stamp else 1
        self.cursor = LogCursor(stamp=stamp, seconds=seconds, nanos=nanos, taken_at_stamp=taken)
        return head[match.end():]

    def _jump_past_stamp(self) -> None:
        after = self.after
        assert after is not None
        self.cursor = LogCursor(stamp="", seconds=after.seconds + 1, nanos=0, taken_at_stamp=0)
        self.lines.append(f"[more than {LOG_SKIP_MAX_BYTES} bytes logged at {after.stamp}: "
                          "the rest of that second was skipped]")

    def _take(self, data: bytes) -> None:
        self.read_bytes += len(data)
        while data:
            end = data.find(b"\n")
            piece = data if end < 0 else data[:end]
            room = self.max_line_bytes - len(self.line)
            if room > 0:
                self.line += piece[:room]
            self.line_length += len(piece)
            if end < 0:
                return
            self._end_line()
            data = data[end + 1 :]

    def _end_line(self, final: bool = False) -> None:
        if final and not self.line_length:
            return
        text = bytes(self.line).decode("utf-8", errors="replace")
        if self.line_length > self.max_line_bytes or (final and self.stopped_in_line):
            text += cut_mark(self.max_line_bytes)
            self.cut += 1
        self.lines.append(text)
        self.line.clear()
        self.line_length = 0
