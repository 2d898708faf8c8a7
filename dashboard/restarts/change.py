"""A restart that changes an engine's launch flags: what a plan carries, and how it is judged.

A plan may carry the engine's next command line (``Restart.change``). How it comes into force is
its mode: ``recreate`` (SparkOps recreates the container with the new command while it runs the
plan, :func:`collectors.docker_api.recreate_with_command`) or ``note`` (the admin recreates it,
e.g. through compose; the runbook restarts it as usual and its record step says whether the
engine then runs the intended flags).

The fit planner (:mod:`collectors.fitplan`) judges the change twice: when the plan is made
(:func:`refusal_at_planning`) and in the runbook's pre-check, on the node's ledger of that moment
(:func:`refusal_at_precheck`): refused when the engine would not start, the host would run out
of memory, or a neighbour's prefill would be squeezed without the admin having accepted that. A
prefill fits "with margin" by the prefill-squeeze alert's margin; this app may not import
alerting (docs/ARCHITECTURE.md), so the caller passes it in bytes and the plan keeps it, and the
pre-check judges with the margin the plan was checked with. The alerting app registers where
the margin in force comes from (:func:`use_prefill_margin`, in its ``AppConfig.ready()``).

What is stored is JSON (:func:`ledger_summary`): the verdict with its words, the headroom and
every engine's parts before and after, each figure with its confidence; an unknown figure has no
value and says why, never 0. :func:`planned_ledger` turns it back into the figures the planner's
page partials show.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from collectors.fitplan import (
    OUT_OF_MEMORY,
    REFUSES,
    SQUEEZED,
    SQUEEZES,
    EngineRow,
    Figure,
    Plan,
    PlanError,
    read_launch,
)
from collectors.redaction import MASK, mask_command
from collectors.vllm.flags import FlagError, parse_command_line
from sparkops.units import fixed_gib_text

__all__ = ["MODES", "NOTE", "RECREATE", "FlagChange", "FlagDifference",
           "PlannedLedger", "command_words", "current_prefill_margin", "flag_differences",
           "has_masked_secret", "ledger_summary", "planned_ledger", "planned_row",
           "refusal_at_planning", "refusal_at_precheck", "runs_intended", "shown_command",
           "use_prefill_margin"]

RECREATE = "recreate"
NOTE = "note"
MODES = {
    NOTE: "note: the admin recreates the container (e.g. through compose); SparkOps restarts "
          "it and records which flags it then runs",
    RECREATE: "recreate: SparkOps recreates the container with the new command during the run",
}


@dataclass(frozen=True)
class FlagChange:
    """What a plan asks to change: the engine's next launch (a ``vllm serve …`` command line or
    a compose service), how it comes into force (:data:`MODES`), the prefill margin in bytes it
    is checked with, and whether the admin accepts a predicted squeeze of a neighbour."""

    command: str
    mode: str
    margin_bytes: int
    accept_squeeze: bool = False


# A compose snippet, as the fit planner tells one from a command line.
_COMPOSE = re.compile(r"^\s*(services|command)\s*:", re.MULTILINE)


# --- where the margin in force comes from -------------------------------------------------------

_margin_source: Callable[[], int] | None = None


def use_prefill_margin(source: Callable[[], int]) -> None:
    """Name the function that gives the prefill-squeeze margin in force, in bytes (the alerting
    app registers the alert's, which this app may not import)."""
    global _margin_source
    _margin_source = source


def current_prefill_margin() -> int | None:
    """The margin in force, or None when no source was registered (nothing is assumed)."""
    return _margin_source() if _margin_source is not None else None


# --- the command line ---------------------------------------------------------------------------


def command_words(text: str) -> list[str]:
    """The words of the launch ``text``: a command line, or a compose service's entrypoint and
    command (``vllm serve`` before a command of flags only, the vllm/vllm-openai image's
    entrypoint), as the fit planner reads it. Raises :class:`collectors.fitplan.PlanError` when it
    cannot be read."""
    try:
        read_launch(text)  # the planner's own reading: its refusal, in its words
        service = _compose_service(text)
        if service is None:
            return shlex.split(text.replace("\\\n", " "))
        words = _words(service.get("command"))
        entrypoint = _words(service.get("entrypoint"))
    except PlanError:
        raise
    except ValueError as error:  # an unclosed quote
        raise PlanError(f"the launch command cannot be read: {error}") from None
    if entrypoint:
        return entrypoint + words
    if words and words[0] not in ("vllm", "python", "python3", "sh", "bash"):
        return ["vllm", "serve", *words]
    return words


def _words(value: Any) -> list[str]:
    if not value:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(word) for word in value]


def _compose_service(text: str) -> dict[str, Any] | None:
    """The one service of a compose snippet (the fit planner accepted it already), or None for
    a command line."""
    if not _COMPOSE.search(text):
        return None
    document = yaml.safe_load(text.strip())
    if not isinstance(document, dict):
        return None
    if isinstance(document.get("services"), dict):
        document = next(iter(document["services"].values()))
    if len(document) == 1 and isinstance(next(iter(document.values())), dict) \
            and "command" not in document:
        document = next(iter(document.values()))
    return document if isinstance(document, dict) else None


def has_masked_secret(words: list[str]) -> bool:
    """Does the command hold a value SparkOps masked (copied from a page)? Starting an engine
    with it would pass the mask as the secret."""
    return any(MASK in word for word in words)


# --- the verdicts -------------------------------------------------------------------------------


def _squeezed(plan: Plan) -> list[str]:
    return [row.name for row in plan.rows if not row.planned and row.verdict == SQUEEZED]


def _refusal(plan: Plan) -> str:
    """Why the engine would not start, as its release would say it."""
    pool = plan.prediction.pool
    return (pool.refusal if pool is not None else None) \
        or plan.verdict_text.removeprefix("The engine refuses to start: ").rstrip(".")


def refusal_at_planning(plan: Plan, *, accept_squeeze: bool) -> str | None:
    """Why a plan with this prediction is refused, None when it may be made: the engine would
    refuse to start, the host would run out of memory, or it squeezes a neighbour's prefill and
    the admin did not accept that."""
    if plan.verdict == REFUSES:
        return f"the engine would refuse to start: {_refusal(plan)}"
    if plan.verdict == OUT_OF_MEMORY:
        return "the host would run out of memory: " + \
            plan.verdict_text.removeprefix("Host out of memory: ").rstrip(".")
    if plan.verdict == SQUEEZES and not accept_squeeze:
        return (f"the new flags squeeze {_names(_squeezed(plan))}'s prefill (it would no longer "
                f"fit with the margin of {fixed_gib_text(plan.margin)}); accept the squeeze to "
                "plan it anyway")
    return None


def refusal_at_precheck(plan: Plan, *, accepted_squeeze: bool) -> str | None:
    """Why the pre-check refuses the change on today's ledger: the verdict is worse than what
    was accepted at planning (it refuses to start, the host would run out of memory, or a
    squeeze the admin did not accept). None when it may go on."""
    if plan.verdict == REFUSES:
        return f"the engine would now refuse to start: {_refusal(plan)}"
    if plan.verdict == OUT_OF_MEMORY:
        return "the host would now run out of memory: " + \
            plan.verdict_text.removeprefix("Host out of memory: ").rstrip(".")
    if plan.verdict == SQUEEZES and not accepted_squeeze:
        return (f"the new flags would now squeeze {_names(_squeezed(plan))}'s prefill, a squeeze "
                "not accepted when it was planned")
    return None


def _names(names: list[str]) -> str:
    return ", ".join(names) or "a neighbour"


# --- the after-ledger as JSON, and back ---------------------------------------------------------


def _figure(figure: Figure) -> dict[str, Any]:
    return {"value": figure.value, "confidence": figure.confidence, "basis": figure.basis}


def _pair(pair: tuple[Figure, Figure]) -> list[dict[str, Any]]:
    return [_figure(pair[0]), _figure(pair[1])]


def ledger_summary(plan: Plan) -> dict[str, Any]:
    """The plan as JSON: its verdict and words, the headroom and what the engine holds before
    and after, every engine's parts, prefill fits, KV tokens and concurrency before and after
    with its verdict, and why each unknown figure is unknown."""
    return {
        "engine": plan.engine, "version": plan.version, "model": plan.model,
        "verdict": plan.verdict, "verdict_text": plan.verdict_text,
        "margin_bytes": plan.margin, "drop_page_cache": plan.drop_page_cache,
        "ledger_at": plan.ledger_at,
        "headroom": _pair(plan.headroom), "held": _pair(plan.held),
        "rows": [{
            "name": row.name, "planned": row.planned,
            "weights": _pair(row.weights), "kv_pool": _pair(row.kv_pool),
            "cuda_graphs": _pair(row.cuda_graphs), "prefill_need": _pair(row.prefill_need),
            "fits": list(row.fits), "kv_tokens": _pair(row.kv_tokens),
            "concurrency": _pair(row.concurrency),
            "verdict": row.verdict, "verdict_text": row.verdict_text,
        } for row in plan.rows],
        "largest": plan.largest.text,
        "unknown_reasons": plan.unknown_reasons,
        "notes": list(plan.notes),
    }


def _figure_back(data: dict[str, Any]) -> Figure:
    return Figure(data.get("value"), data.get("confidence") or "unknown — not recorded",
                  data.get("basis") or "")


def _pair_back(data: list[dict[str, Any]]) -> tuple[Figure, Figure]:
    return _figure_back(data[0]), _figure_back(data[1])


@dataclass(frozen=True)
class PlannedLedger:
    """A stored after-ledger, as the pages show it."""

    engine: str
    version: str
    verdict: str
    verdict_text: str
    margin_bytes: int
    headroom: tuple[Figure, Figure]
    held: tuple[Figure, Figure]
    rows: list[EngineRow]  # the planner's rows, read back
    largest: str
    unknown_reasons: list[str]
    ledger_at: str | None

    @property
    def margin_text(self) -> str:
        return fixed_gib_text(self.margin_bytes)


def planned_ledger(summary: dict[str, Any] | None) -> PlannedLedger | None:
    """The figures of a :func:`ledger_summary` back (None when there is none)."""
    if not summary or "rows" not in summary:
        return None
    rows = [EngineRow(
        name=row["name"], planned=row["planned"], weights=_pair_back(row["weights"]),
        kv_pool=_pair_back(row["kv_pool"]), cuda_graphs=_pair_back(row["cuda_graphs"]),
        prefill_need=_pair_back(row["prefill_need"]), fits=tuple(row["fits"]),
        kv_tokens=_pair_back(row["kv_tokens"]), concurrency=_pair_back(row["concurrency"]),
        verdict=row["verdict"], verdict_text=row["verdict_text"]) for row in summary["rows"]]
    return PlannedLedger(
        engine=summary["engine"], version=summary.get("version") or "",
        verdict=summary["verdict"], verdict_text=summary["verdict_text"],
        margin_bytes=summary["margin_bytes"], headroom=_pair_back(summary["headroom"]),
        held=_pair_back(summary["held"]), rows=rows, largest=summary.get("largest") or "",
        unknown_reasons=list(summary.get("unknown_reasons") or []),
        ledger_at=summary.get("ledger_at"))


def planned_row(plan: Plan) -> EngineRow:
    """The planned engine's own row of a plan."""
    return next(row for row in plan.rows if row.planned)


# --- flags: what differs, and whether the engine runs the intended ones ------------------------


@dataclass(frozen=True)
class FlagDifference:
    """One flag that differs: its value now and intended (None: not given; "" a switch)."""

    flag: str
    now: str | None
    intended: str | None


def _flag_values(words: list[str]) -> dict[str, str]:
    config = parse_command_line(mask_command(words))
    values = {"model": config.model or ""}
    for name, value in config.all_flags.items():
        if value is True:
            values[f"--{name}"] = ""
        elif value is False:
            values[f"--no-{name}"] = ""
        else:
            values[f"--{name}"] = " ".join(value) if isinstance(value, tuple) else str(value)
    return values


def flag_differences(now: list[str], intended: list[str]
                     ) -> tuple[list[FlagDifference] | None, str]:
    """The flags that differ between two vLLM command lines (the model first), secrets masked;
    ``(None, why)`` when one of them cannot be read."""
    try:
        before, after = _flag_values(now), _flag_values(intended)
    except FlagError as error:
        return None, str(error)
    names = list(dict.fromkeys([*before, *after]))
    return [FlagDifference(name, before.get(name), after.get(name)) for name in names
            if before.get(name) != after.get(name)], ""


def runs_intended(actual: list[str], intended: list[str]) -> tuple[bool | None, str]:
    """Does an engine started with ``actual`` run the ``intended`` flags? Compared as vLLM reads
    them (``64M`` and ``67108864`` alike), secrets masked on both sides. ``(None, why)`` when a
    command cannot be read; the words say what differs."""
    try:
        now = parse_command_line(mask_command(actual)).as_dict()
        wanted = parse_command_line(mask_command(intended)).as_dict()
    except FlagError as error:
        return None, f"its flags cannot be read: {error}"
    ignored = {"launcher", "all_flags"}
    if {k: v for k, v in now.items() if k not in ignored} == \
            {k: v for k, v in wanted.items() if k not in ignored}:
        return True, "it runs the intended flags"
    differences, _ = flag_differences(actual, intended)
    said = "; ".join(f"{d.flag} {d.now if d.now is not None else '(not given)'} "
                     f"(intended {d.intended if d.intended is not None else 'not given'})"
                     for d in differences or [])
    return False, f"it still runs other flags than the intended ones: {said or 'as read by vLLM'}"


def shown_command(words: list[str]) -> str:
    """A command line for the pages and the audit: secrets masked."""
    return shlex.join(mask_command(words))

