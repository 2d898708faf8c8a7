"""What every engine kind's reader provides, and the shapes it hands to the rest of SparkOps.

An engine *kind* (vLLM, llama.cpp's ``llama-server``, Ollama, …) is read by one
:class:`KindReader`: it recognises the kind's containers by the words of their command line and
image, reads the launch settings from the command line (and environment), follows the startup
log, and reads the engine's own HTTP endpoints. Each reader normalises what its engine reports
into the shapes the ledger, rates, alerts and pages already read, so that nothing downstream
knows which kind it looks at:

* ``Engine.config`` — the launch settings: ``model``, ``served_model_name``, ``port``,
  ``max_num_seqs`` (slots), ``max_num_batched_tokens`` (how many prompt tokens one step
  computes: the width of a prefill's activation buffer), ``kv_cache_memory_bytes`` (a pool size
  fixed by a flag), ``all_flags`` (every flag by its long name);
* ``Engine.startup`` — a :class:`KindStartup` (or vLLM's own ``StartupLog``): phase, weights,
  KV pool, CUDA graphs, errors;
* ``Engine.metrics["snapshot"]`` — a :class:`~collectors.vllm.metrics.MetricsSnapshot`, whose
  counters feed :func:`~collectors.vllm.rates.compute_rates` unchanged;
* ``Engine.metrics["unknown"]`` — for each part of the ledger or the pages that this kind
  cannot report, the reason in words (``{"kv_pool": "Ollama reports …"}``): such a part is
  None and shown as "unknown — <reason>", never 0;
* ``Engine.metrics["details"]`` — what only this kind reports (llama.cpp's slots, Ollama's
  loaded models), JSON-ready.

A read is all or nothing, as a vLLM scrape: a :class:`Reading` comes back whole or
:class:`~collectors.vllm.scrape.ScrapeError` is raised with a one-line reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from collectors.kinds.discovery import runs
from collectors.vllm.findings import MountCheck, stale_mounts
from collectors.vllm.logs import LogError
from collectors.vllm.metrics import MetricsSnapshot

# The phases a startup log moves through, in order (as vLLM's, so alert rules and pages read
# every kind alike): ``kv_allocated`` once the KV pool is sized, ``ready`` once it serves.
PHASES = ("unknown", "loading", "profiling", "kv_allocated", "ready", "failed")
_RANK = {phase: rank for rank, phase in enumerate(PHASES)}
SEVERITIES = ("error", "warning", "info")  # most severe first
_MAX_MESSAGE = 500


class LaunchError(Exception):
    """A command line the reader cannot read as its kind's launch; the message says why."""


@dataclass(frozen=True)
class Launch:
    """A container's launch as its kind's reader read it.

    ``config`` is what ``Engine.config`` stores (JSON-ready, secrets already masked by the
    caller); ``native`` is the reader's own parsed object (vLLM's ``EngineConfig``), for its
    findings.
    """

    model: str | None
    port: int
    config: dict[str, Any]
    native: Any = None


@dataclass(frozen=True)
class Reading:
    """One complete read of an engine's endpoints: ``snapshot`` in vLLM's shape, ``details``
    only this kind has, and ``unknown`` (part -> reason) for what it could not report."""

    snapshot: MetricsSnapshot
    details: dict[str, Any] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)


@dataclass
class KindStartup:
    """What the last startup in a non-vLLM engine's log said, in the keys of vLLM's
    ``StartupLog`` that the ledger and pages read. ``None`` always means "not logged".

    Sizes are GiB as the engine printed them (MiB / 1024, not rounded further).
    ``kv_sized_by`` says in words what fixed the KV pool (e.g. "-c 65536: 65,536 cells"), where
    vLLM's pages say "pinned" or "profiled". ``compute_buffer_gib`` is memory reserved at start
    for activations (llama.cpp sizes it for one ``--ubatch-size`` step and holds it).
    """

    phase: str = "unknown"
    version: str | None = None
    startup_count: int = 0
    started_at: str | None = None
    ready_at: str | None = None
    startup_seconds: float | None = None
    weights_gib: float | None = None
    weights_load_seconds: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_pinned: bool | None = None
    kv_cache_tokens: int | None = None
    kv_sized_by: str | None = None
    max_concurrency: float | None = None
    concurrency_for_tokens: int | None = None
    cuda_graph_gib: float | None = None
    compute_buffer_gib: float | None = None
    layers_offloaded: str | None = None
    listening_on: str | None = None
    backends: list[str] = field(default_factory=list)
    errors: list[LogError] = field(default_factory=list)

    @property
    def recognised(self) -> bool:
        """False when not a single line of the kind's startup was found."""
        return self.phase != "unknown"

    def reach(self, phase: str) -> None:
        """Move forward to ``phase`` (never back, except to ``failed``)."""
        if phase == "failed" or _RANK[phase] > _RANK[self.phase]:
            self.phase = phase

    def as_dict(self) -> dict[str, Any]:
        data = {item.name: getattr(self, item.name) for item in fields(self)}
        data["errors"] = [error.as_dict() for error in self.errors]
        data["backends"] = list(self.backends)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KindStartup:
        known = {item.name for item in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["errors"] = [LogError(**error) for error in data.get("errors", [])]
        return cls(**values)


class LineLogParser:
    """The common part of a non-vLLM kind's startup-log parser: ``feed`` complete lines to
    :meth:`_line` (each kind's own), :meth:`_error` for the kind's failure signatures
    (``ERRORS``: stable kind and pattern), and :meth:`result`, the last startup with how many
    the log held. Subclasses set ``self.startup`` anew (and count ``self._startups``) where a
    new startup begins."""

    ERRORS: tuple[tuple[str, re.Pattern[str]], ...] = ()

    def __init__(self) -> None:
        self._startups = 0
        self.startup = KindStartup()

    def feed(self, text: str) -> None:
        for line in text.splitlines():
            self._line(line)

    def _line(self, line: str) -> None:
        self._error(line)

    def _error(self, line: str) -> bool:
        """Record ``line`` as a failed start when it matches a failure signature."""
        for kind, pattern in self.ERRORS:
            if match := pattern.search(line):
                self.startup.errors.append(LogError(kind, match.group(0)[:_MAX_MESSAGE]))
                self.startup.reach("failed")
                return True
        return False

    def result(self) -> KindStartup:
        startup = KindStartup.from_dict(self.startup.as_dict())
        startup.startup_count = self._startups
        return startup


def kind_findings(launch_findings: list[dict[str, str]], startup: KindStartup | None,
                  mounts: list[MountCheck]) -> list[dict[str, str]]:
    """A kind's findings, most severe first: those of its launch, each startup error the log
    showed (as vLLM's ``startup-error``) and every stale bind mount."""
    found = list(launch_findings)
    if startup is not None:
        found += [{"code": "startup-error", "severity": "error",
                   "message": f"The engine failed to start ({error.kind}): {error.message}"}
                  for error in startup.errors]
    found += [f.as_dict() for f in stale_mounts(mounts)]
    return sorted(found, key=lambda f: SEVERITIES.index(f["severity"]))


class StartupParser(Protocol):
    """A startup log read in pieces: ``feed`` complete lines, ``result`` the last startup."""

    def feed(self, text: str) -> None: ...

    def result(self) -> Any: ...


class KindReader(Protocol):
    """One engine kind: how its containers are recognised and how each part is read."""

    kind: str  # the stored ``Engine.kind`` and the ``sparkops.engine`` label value
    title: str  # for people: "vLLM", "llama.cpp server", "Ollama"
    endpoints: str  # what a failed read names: "/metrics", "llama-server API", …
    default_port: int  # where it listens when its launch does not say
    health_path: str  # answers 200 once the engine serves (a restart waits for it)
    # Parts of the ledger and pages this kind never reports, with the reason (kind-wide).
    never_reported: Mapping[str, str]

    def matches(self, words: Sequence[str]) -> bool:
        """Does this command line or image name run this kind?"""

    def parse_launch(self, command: list[str], env: Mapping[str, str]) -> Launch:
        """The launch settings; raises :class:`LaunchError` when they cannot be read."""

    def new_log_parser(self) -> StartupParser:
        """A fresh parser of this kind's startup log."""

    def startup_from_dict(self, data: Mapping[str, Any]) -> Any:
        """A stored ``Engine.startup`` back as the parser's result type."""

    def findings(self, launch: Launch | None, startup: Any,
                 mounts: list[MountCheck]) -> list[dict[str, str]]:
        """Configuration findings (``{code, severity, message}``), most severe first."""

    def read(self, base_url: str, *, deadline: float) -> Reading:
        """Read the engine's endpoints under ``base_url`` within ``deadline`` seconds in all;
        raises :class:`~collectors.vllm.scrape.ScrapeError` with a one-line reason."""



class ModuleKind:
    """A :class:`KindReader` made of its module's parts, for a kind whose stored startup is a
    :class:`KindStartup` and whose findings are :func:`kind_findings` of its launch checks.
    A subclass names, besides the :class:`KindReader` attributes, ``log_parser`` (the class of
    its startup parser, whose result is a :class:`KindStartup`) and, as static methods,
    ``launch_parser(command, env)``, ``launch_checks(config)`` and
    ``endpoint_reader(base_url, deadline=)``."""

    kind: str
    log_parser: Callable[[], StartupParser]
    launch_parser: Callable[[list[str], Mapping[str, str]], Launch]
    launch_checks: Callable[[dict[str, Any]], list[dict[str, str]]]
    endpoint_reader: Callable[..., Reading]

    def matches(self, words: Sequence[str]) -> bool:
        return runs(self.kind, words)

    def parse_launch(self, command: list[str], env: Mapping[str, str]) -> Launch:
        return self.launch_parser(command, env)

    def new_log_parser(self) -> StartupParser:
        return self.log_parser()

    def startup_from_dict(self, data: Mapping[str, Any]) -> KindStartup:
        return KindStartup.from_dict(data)

    def findings(self, launch: Launch | None, startup: KindStartup | None,
                 mounts: list[MountCheck]) -> list[dict[str, str]]:
        return kind_findings(self.launch_checks(launch.config) if launch else [], startup,
                             mounts)

    def read(self, base_url: str, *, deadline: float) -> Reading:
        return self.endpoint_reader(base_url, deadline=deadline)


def gib_from_mib(mib: float) -> float:
    """MiB as printed, in GiB for the ledger (which turns GiB into bytes)."""
    return mib / 1024
