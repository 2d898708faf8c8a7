"""llama-swap (a model router that starts and stops models on demand) as an engine kind.

Source: github.com/mostlygeek/llama-swap at commit 0bdb3720 (2026-08-22); files below are in
that tree.

**The router** listens on ``:8080`` unless ``-listen`` says otherwise (llama-swap.go:69) and is
read through two endpoints that start nothing:

* ``GET /running`` (internal/server/api.go:312-352 ``handleRunning``): ``{"running": [{"model",
  "state", "cmd", "proxy", "ttl", "name", "description"}]}``, one entry per process that is not
  stopped or shut down (internal/router/base.go:366 ``RunningModels``), so ``state`` is
  ``starting``, ``ready`` or ``stopping`` (internal/process/process.go:14-20). ``ttl`` is the
  model's ``ttl:`` in seconds after the global default was applied (0: never unloaded;
  internal/config/load.go:139); ``cmd`` and ``proxy`` are the configured strings.
* ``GET /v1/models`` (api.go:134 ``handleListModels``): ``{"object": "list", "data": [{"id",
  "status": {"value": "loaded"|"unloaded"}, "meta": {"llamaswap": {"type": "model"|"alias"|
  "peer"|"selector"|"profile", "aliases": […]}}}]}``: every configured model except those
  marked ``unlisted:`` (api.go:194), plus aliases, peers, selectors and profile pins, which are
  not models of this router and are skipped here.

**A model's own engine** is reached through ``/upstream/<model>/<path>`` (api.go:479
``handleUpstream``), which forwards to the model's ``proxy``. That route *starts* a model that is
not running (only paths matching ``upstream.ignorePaths``, static files by default, are refused
with 409: internal/config/upstream.go:14), and every request it forwards counts as use: the
process records ``lastUse`` when it completes (internal/process/process_command.go:762) and its
TTL timer unloads it only after ``ttl`` seconds without one (process_command.go:306-322). A read
every collection would therefore keep a model with a TTL loaded for ever. So SparkOps reads a
model through the router only while it is ``ready`` *and* has no TTL (``ttl`` 0); a model with
a TTL is watched from ``/running`` and ``/proc`` only, and its rates are "unknown" with that
reason. Nothing SparkOps does starts a model or keeps one loaded.

**Which kind a model is** comes from its ``cmd`` (``llama-server`` → llama.cpp, ``vllm`` →
vLLM, …, as :mod:`collectors.kinds.discovery` reads a container's command line), and its launch
settings from that kind's reader.

A read is all or nothing for the router's two endpoints (a :class:`RouterReading`, or
:class:`~collectors.vllm.scrape.ScrapeError` with a one-line reason); each running model's own
read succeeds or fails on its own (:attr:`AdoptedModel.read_error`), so one model that does not
answer does not hide the others.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from collectors.kinds.base import KindReader, Launch, LaunchError, Reading, kind_findings
from collectors.kinds.discovery import WORDS, runs, word_pattern
from collectors.kinds.http import Clock, get_json, parse_error
from collectors.vllm.findings import MountCheck
from collectors.vllm.metrics import MetricsSnapshot
from collectors.vllm.scrape import ScrapeError

DEFAULT_PORT = 8080
# internal/process/process.go:14-20; /running never lists stopped or shutdown processes.
RUNNING_STATES = ("starting", "ready", "stopping")
# The phase of a configured model that the router has not started or has stopped: not failed
# and not gone, only not loaded now (engine-down leaves it alone).
UNLOADED = "unloaded"
PROGRAM = word_pattern("llama-swap", "llamaswap", "llama_swap")


@dataclass(frozen=True)
class RunningModel:
    """One entry of ``GET /running``."""

    name: str
    state: str
    cmd: str
    proxy: str
    ttl: int


@dataclass(frozen=True)
class ListedModel:
    """One model of ``GET /v1/models`` (its ``status.value``: loaded or unloaded)."""

    name: str
    status: str
    aliases: tuple[str, ...] = ()


def parse_running(data: Any) -> list[RunningModel]:
    """The models ``GET /running`` lists, checked (another server's reply is refused)."""
    items = data.get("running") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise parse_error("GET /running: not llama-swap's /running: no running list")
    models = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("model"), str) \
                or not item["model"] or item.get("state") not in RUNNING_STATES \
                or not isinstance(item.get("cmd"), str) or not isinstance(item.get("proxy"), str) \
                or not _whole(item.get("ttl")) or item["ttl"] < 0:
            raise parse_error("GET /running: invalid entry: needs a model, a state of "
                              f"{'/'.join(RUNNING_STATES)}, cmd and proxy strings and a whole "
                              "ttl ≥ 0")
        models.append(RunningModel(name=item["model"], state=item["state"], cmd=item["cmd"],
                                   proxy=item["proxy"], ttl=item["ttl"]))
    return models


def parse_models(data: Any) -> list[ListedModel]:
    """The router's own models in ``GET /v1/models`` (aliases, peers, selectors and profile
    pins left out), checked."""
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise parse_error("GET /v1/models: not an OpenAI model list: no data list")
    models = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise parse_error("GET /v1/models: invalid model entry: needs an id")
        meta = item.get("meta")
        swap = meta.get("llamaswap") if isinstance(meta, dict) else None
        if not isinstance(swap, dict):
            raise parse_error(f"GET /v1/models: {item['id']} has no meta.llamaswap: not "
                              "llama-swap's model list")
        if swap.get("type") != "model":
            continue
        status = item.get("status")
        value = status.get("value") if isinstance(status, dict) else None
        if value not in ("loaded", "unloaded"):
            raise parse_error(f"GET /v1/models: {item['id']}: status.value {value!r} is "
                              "neither loaded nor unloaded")
        aliases = swap.get("aliases") or []
        models.append(ListedModel(name=item["id"], status=value,
                                  aliases=tuple(a for a in aliases if isinstance(a, str))))
    return models


def model_kind(cmd: str) -> str | None:
    """The engine kind a model's ``cmd`` runs (``llama-server …`` → ``llamacpp``); None when
    it names none SparkOps reads."""
    words = cmd_words(cmd)
    for kind in WORDS:
        if kind != "llamaswap" and runs(kind, words):
            return kind
    return None


def cmd_words(cmd: str) -> list[str]:
    """``cmd`` split as llama-swap splits it (shell words)."""
    try:
        return shlex.split(cmd)
    except ValueError:
        return cmd.split()


def proxy_port(proxy: str) -> int | None:
    """The port of a model's ``proxy`` URL (``http://127.0.0.1:5800`` → 5800)."""
    try:
        parts = urlsplit(proxy)
        return parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None


@dataclass
class AdoptedModel:
    """A configured model of a router, as one read of the router saw it.

    ``state`` is its process's (starting, ready, stopping) while it runs, else ``unloaded``;
    ``cmd``, ``proxy`` and ``ttl`` are known only while it runs (``/running``), None otherwise.
    ``reading`` is its own engine's read through the router (None when not read, and
    ``read_error`` then says why it failed, if it was tried); ``unknown`` the parts it could not
    report, with the reason.
    """

    name: str
    state: str
    listed: bool
    cmd: str | None = None
    proxy: str | None = None
    ttl: int | None = None
    kind: str | None = None
    reading: Reading | None = None
    read_error: str = ""
    unknown: dict[str, str] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.state != UNLOADED


@dataclass(frozen=True)
class RouterReading(Reading):
    """A router's read: its own (empty) snapshot and details, and each configured model."""

    models: tuple[AdoptedModel, ...] = ()


def ttl_words(ttl: int | None) -> str:
    """The model's TTL for people."""
    if ttl is None:
        return "unknown (llama-swap reports a model's ttl only while it runs)"
    if ttl == 0:
        return "never unloaded for idleness (ttl 0)"
    return f"unloads after {ttl} s idle"


TTL_READ_REASON = ("reading it through llama-swap's /upstream would count as use and restart "
                   "its {ttl} s idle timer (llama-swap internal/process/process_command.go:762), "
                   "keeping it loaded; SparkOps reads only models without a ttl")


def read_router(base_url: str, *, deadline: float,
                readers: Mapping[str, KindReader] | None = None) -> RouterReading:
    """``/running`` and ``/v1/models`` (all or nothing), then each ready model without a TTL
    through ``/upstream/<model>`` with its kind's reader, within one ``deadline``."""
    clock = Clock(deadline)
    _, running_data = get_json(base_url, "/running", clock)
    running = parse_running(running_data)
    _, models_data = get_json(base_url, "/v1/models", clock)
    listed = parse_models(models_data)
    if readers is None:
        from collectors.kinds.registry import READERS as readers  # noqa: N811 (a cycle)
    by_name: dict[str, AdoptedModel] = {
        m.name: AdoptedModel(name=m.name, state=UNLOADED, listed=True) for m in listed}
    for entry in running:
        model = by_name.setdefault(entry.name, AdoptedModel(name=entry.name, state=UNLOADED,
                                                            listed=False))
        model.state, model.cmd, model.proxy, model.ttl = (entry.state, entry.cmd, entry.proxy,
                                                          entry.ttl)
        model.kind = model_kind(entry.cmd)
        _read_model(base_url, model, clock, readers)
    models = tuple(sorted(by_name.values(), key=lambda m: m.name))
    loaded = [m.name for m in models if m.running]
    return RouterReading(
        snapshot=MetricsSnapshot(model_name=None, engine=None),
        details={"models": [_model_details(m) for m in models],
                 "state": f"router: {len(loaded)} of {len(models)} models running"
                          + (f" ({', '.join(loaded)})" if loaded else "")},
        unknown={"rates": "llama-swap keeps no token counters of its own; each model it runs "
                          "is an engine of its own (<router>/<model>)",
                 "kv_pool": "llama-swap holds no KV cache; its models do"},
        models=models)


def _read_model(base_url: str, model: AdoptedModel, clock: Clock,
                readers: Mapping[str, KindReader]) -> None:
    """Read one running model's engine through the router, where that starts nothing and
    resets no idle timer; otherwise say why not in ``model.unknown``."""
    reader = readers.get(model.kind) if model.kind else None
    if reader is None:
        model.unknown["rates"] = (f"llama-swap runs it as {cmd_words(model.cmd or '')[:1]}, "
                                  "which is no engine kind SparkOps reads")
        return
    if model.state != "ready":
        model.unknown["rates"] = f"llama-swap reports it {model.state}; it is read once ready"
        return
    if model.ttl:
        model.unknown["rates"] = TTL_READ_REASON.format(ttl=model.ttl)
        return
    path = f"/upstream/{quote(model.name, safe='')}"
    try:
        model.reading = reader.read(f"{base_url}{path}", deadline=clock.left(path))
    except ScrapeError as error:
        model.read_error = f"{path}: {error.reason}"


def _model_details(model: AdoptedModel) -> dict[str, Any]:
    return {"name": model.name, "state": model.state, "listed": model.listed,
            "kind": model.kind, "ttl": model.ttl, "ttl_words": ttl_words(model.ttl),
            "proxy": model.proxy}


def parse_launch(command: Sequence[str], env: Mapping[str, str]) -> Launch:
    """The router's own launch: ``-config`` and ``-listen`` (Go's flag package: one or two
    dashes, ``-flag value`` or ``-flag=value``)."""
    words = list(command)
    start = next((i for i, word in enumerate(words) if PROGRAM.search(word.rsplit("/", 1)[-1])),
                 None)
    if start is None:
        raise LaunchError("no llama-swap invocation found in the command line")
    found: dict[str, str | bool] = {}
    args = words[start + 1:]
    index = 0
    while index < len(args):
        word = args[index]
        index += 1
        if not word.startswith("-"):
            continue
        name, has_inline, inline = word.lstrip("-").partition("=")
        if has_inline:
            found[name] = inline
        elif name in ("config", "config-dir", "listen", "tls-cert-file", "tls-key-file"):
            if index >= len(args):
                raise LaunchError(f"-{name} expects a value")
            found[name] = args[index]
            index += 1
        else:
            found[name] = True
    listen = str(found.get("listen") or "")
    port = DEFAULT_PORT
    if listen:
        try:
            port = int(listen.rpartition(":")[2])
        except ValueError:
            raise LaunchError(f"-listen {listen!r} has no port") from None
    config = {"launcher": "llama-swap", "model": None, "served_model_name": None, "port": port,
              "config_file": found.get("config"), "router": True, "max_num_seqs": None,
              "max_num_batched_tokens": None, "kv_cache_memory_bytes": None,
              "all_flags": found}
    return Launch(model=None, port=port, config=config)


class _NoStartupLog:
    """llama-swap's log holds its own lines and its models' interleaved: no startup phases are
    read from it (the router serves once ``/running`` answers)."""

    def feed(self, text: str) -> None:
        return None

    def result(self) -> None:
        return None


class LlamaSwapReader:
    kind = "llamaswap"
    title = "llama-swap"
    endpoints = "llama-swap API"
    default_port = DEFAULT_PORT
    health_path = "/health"  # internal/server/server.go:288
    never_reported: Mapping[str, str] = {
        "weights": "llama-swap holds no weights; each model it runs is an engine of its own",
        "cuda_graphs": "llama-swap holds no CUDA graphs; its models do",
        "ttft": "llama-swap has no latency histograms",
    }

    def matches(self, words: Sequence[str]) -> bool:
        return runs(self.kind, words)

    def parse_launch(self, command: list[str], env: Mapping[str, str]) -> Launch:
        return parse_launch(command, env)

    def new_log_parser(self) -> _NoStartupLog:
        return _NoStartupLog()

    def startup_from_dict(self, data: Mapping[str, Any]) -> None:
        return None

    def findings(self, launch: Launch | None, startup: Any,
                 mounts: list[MountCheck]) -> list[dict[str, str]]:
        return kind_findings([], None, mounts)

    def read(self, base_url: str, *, deadline: float) -> RouterReading:
        return read_router(base_url, deadline=deadline)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
