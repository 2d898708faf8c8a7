"""The fit planner: what happens to a node if one vLLM engine is (re)started with other flags.

On a GB10 every restart costs minutes and its effect on the neighbours shows only afterwards.
The planner answers before anyone restarts anything, from what SparkOps already knows: the
node's latest stored ledger (``Node.ledger``, written after every host-memory collection), each
engine's prefill need in it, and the prediction of collectors.vllm.poolplan for the changed
engine (its pool, the start-up refusal, its KV plan and its own prefill need).

The after-ledger keeps every neighbour as it is and replaces the planned engine's weights, KV
pool and CUDA graphs by the predicted ones; the memory it holds today is handed back first, so
the headroom after is ``headroom - held today + held after`` (host and, for an engine inside the
memory budget, the budget's room alike). Dropping the page cache does not move the headroom
(MemAvailable counts reclaimable cache) but does move what vLLM releases before 0.20 read as
free at boot, which is why it can let an older engine start.

A prefill "fits with margin" by the prefill-squeeze alert's own rule (:func:`prefill_fits`),
with the margin the caller passes: the alert's margin in force for the planner page and the
predicted-squeeze alert, the one a restart plan was checked with for its pre-check. The
largest pool the engine can take while every neighbour's prefill still fits is a closed form:
the after-headroom falls byte for byte with the pool.

Every figure carries its confidence (collectors.vllm.kvplan's "exact", "estimate", "reported"
for what an engine or the host measured, or "unknown — why"); an unknown figure is never 0.
Input the planner cannot honestly answer (an unreadable command, an unknown model, a flag the
release refuses, an engine kind not modelled) raises :class:`PlanError` with one line.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from collectors.modelarch import Architecture, ArchitectureUnknown, architecture_for
from collectors.models import Engine, Node
from collectors.vllm.flags import EngineConfig, FlagError, parse_command_line
from collectors.vllm.kvplan import (
    ESTIMATE,
    EXACT,
    EngineSettings,
    FlagRejected,
    Unmodelled,
    check_flags,
    plan_kv,
    rules_for,
    settings_from_config,
    unknown_plan,
)
from collectors.vllm.poolplan import BootMemory, EnginePrediction, Usage, predict, startup_refusal
from sparkops.units import fixed_gib_text

REPORTED = "reported"

FITS = "fits"
SQUEEZES = "squeezes"
SQUEEZED = "squeezed"
ALREADY_SQUEEZED = "already squeezed"
REFUSES = "refuses to start"
OUT_OF_MEMORY = "host out of memory"
UNKNOWN_VERDICT = "unknown"


class PlanError(ValueError):
    """Input the planner cannot answer for; ``str(error)`` is one line naming what is wrong."""


@dataclass(frozen=True)
class Figure:
    """A number with its confidence ("exact", "estimate", "reported" or "unknown — why") and
    what it rests on; ``value`` is None exactly when the confidence is unknown."""

    value: int | float | None
    confidence: str
    basis: str = ""

    @property
    def known(self) -> bool:
        return self.value is not None

    @property
    def text(self) -> str:
        if self.value is None:
            return self.confidence
        if isinstance(self.value, float):
            return f"{self.value:,.2f}"
        return f"{self.value:,}"

    @property
    def gib_text(self) -> str:
        return self.confidence if self.value is None else fixed_gib_text(self.value)


def unknown(why: str) -> Figure:
    return Figure(None, f"unknown — {why}", why)


def _reported(value: int | None, what: str) -> Figure:
    return unknown(f"{what} was not reported") if value is None else Figure(value, REPORTED, what)


def _weakest(*confidences: str) -> str:
    if any(c.startswith("unknown") for c in confidences):
        return next(c for c in confidences if c.startswith("unknown"))
    return EXACT if all(c == EXACT for c in confidences) else ESTIMATE


# --- the rule a prefill fits by ------------------------------------------------------------------


def prefill_fits(headroom: int | None, need: int | None, margin: int) -> bool | None:
    """The prefill-squeeze rule: a prefill fits while headroom minus the margin is at least its
    need (the alert fires below that). None when either figure is unknown."""
    if headroom is None or need is None:
        return None
    return headroom - margin >= need


# --- reading what was pasted ---------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    config: EngineConfig
    version_hint: str | None  # from a compose service's image tag


_VERSION_TAG = re.compile(r":v?(\d+\.\d+(?:\.\d+)?)")


def read_launch(text: str) -> Launch:
    """A ``vllm serve …`` command line or a compose service (its ``command:``, with the image's
    ``vllm serve`` entrypoint when it gives none). Raises :class:`PlanError`."""
    text = text.strip()
    if not text:
        raise PlanError("the launch command is empty: paste a `vllm serve MODEL …` command or a "
                        "compose service")
    service = _compose_service(text)
    hint = None
    if service is not None:
        command = service.get("command")
        if not command:
            raise PlanError("the compose service has no command: to read the flags from")
        words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
        entrypoint = service.get("entrypoint")
        if entrypoint:
            words = (shlex.split(entrypoint) if isinstance(entrypoint, str)
                     else [str(w) for w in entrypoint]) + words
        elif words and words[0] not in ("vllm", "python", "python3", "sh", "bash"):
            words = ["vllm", "serve", *words]  # the vllm/vllm-openai image's entrypoint
        match = _VERSION_TAG.search(str(service.get("image") or ""))
        hint = match.group(1) if match else None
    else:
        words = text  # type: ignore[assignment]
    try:
        return Launch(parse_command_line(words), hint)
    except FlagError as error:
        raise PlanError(f"the launch command cannot be read: {error}") from None


def _compose_service(text: str) -> dict[str, Any] | None:
    """The one service of a pasted compose snippet, or None when the text is a command line."""
    if not re.search(r"^\s*(services|command)\s*:", text, re.MULTILINE):
        return None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise PlanError(f"the compose text is not valid YAML: {str(error).splitlines()[0]}") \
            from None
    if not isinstance(document, dict):
        raise PlanError("the compose text is not a service: expected `command:` or `services:`")
    if isinstance(document.get("services"), dict):
        services = document["services"]
        if len(services) != 1:
            raise PlanError(f"the compose file has {len(services)} services "
                            f"({', '.join(map(str, services))}): paste one of them")
        document = next(iter(services.values()))
    if len(document) == 1 and isinstance(next(iter(document.values())), dict) \
            and "command" not in document:
        document = next(iter(document.values()))  # "name: {image, command}"
    return document if isinstance(document, dict) else None


# --- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class History:
    """What earlier starts on the node measured, to correct a prediction (collectors.starts):
    the weights and CUDA graphs the same model reported at its latest start (used where the
    running engine reports none, e.g. a recreated container that has not loaded yet), and how
    far the free memory vLLM read at boot typically was from the planner's figure (added to the
    free memory at boot). ``notes`` says each correction in words."""

    weights_bytes: int | None = None
    cudagraph_bytes: int | None = None
    free_at_boot_offset: int | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: an engine of the node by name (None: a new engine) started with
    ``command``; ``version`` names the vLLM release of a new engine; ``drop_page_cache``
    plans the start after the page cache was dropped; ``history`` corrects the prediction
    from earlier starts."""

    engine: str | None
    command: str
    version: str | None = None
    drop_page_cache: bool = False
    history: History | None = None


@dataclass(frozen=True)
class EngineRow:
    """One engine of the node, today and after the change."""

    name: str
    planned: bool
    weights: tuple[Figure, Figure]
    kv_pool: tuple[Figure, Figure]
    cuda_graphs: tuple[Figure, Figure]
    prefill_need: tuple[Figure, Figure]
    fits: tuple[bool | None, bool | None]
    kv_tokens: tuple[Figure, Figure]
    concurrency: tuple[Figure, Figure]
    verdict: str
    verdict_text: str


@dataclass(frozen=True)
class LargestPool:
    """The largest KV pool the planned engine can take while every neighbour's prefill fits."""

    pool: Figure
    kv_tokens: Figure
    concurrency: Figure
    text: str


@dataclass
class Plan:
    node: str
    engine: str
    version: str
    model: str | None
    margin: int
    drop_page_cache: bool
    prediction: EnginePrediction
    headroom: tuple[Figure, Figure]
    page_cache: tuple[Figure, Figure]
    held: tuple[Figure, Figure]  # what the planned engine holds today / after
    rows: list[EngineRow]
    verdict: str
    verdict_text: str
    refusal_if_cache_dropped: str | None
    largest: LargestPool
    ledger_at: str | None
    free_at_boot: Figure = field(default_factory=lambda: unknown("not planned"))
    notes: list[str] = field(default_factory=list)

    @property
    def margin_text(self) -> str:
        return fixed_gib_text(self.margin)

    @property
    def unknown_reasons(self) -> list[str]:
        """Why each figure of the table that has no number has none, each reason once (the
        cells say "unknown" and point here, instead of repeating it)."""
        figures = [figure for row in self.rows
                   for pair in (row.weights, row.kv_pool, row.cuda_graphs, row.prefill_need,
                                row.kv_tokens, row.concurrency)
                   for figure in pair]
        figures += [self.largest.kv_tokens, self.largest.concurrency]
        reasons = dict.fromkeys(figure.basis for figure in figures if not figure.known)
        return [reason for reason in reasons if reason]


def plan(node: Node, engines: list[Engine], request: PlanRequest, margin: int) -> Plan:
    """The node's ledger after ``request``'s change next to today's, a prefill fitting with
    ``margin`` bytes to spare (the prefill-squeeze alert's, for the pages and alerts; what the
    plan was checked with, for a restart). Raises :class:`PlanError`."""
    ledger = node.ledger or {}
    if not ledger or not ledger.get("mem_total"):
        raise PlanError(f"node {node.name} has no memory ledger yet: wait for its first "
                        "host-memory collection")
    target = _target(engines, request.engine)
    if target is not None and target.kind != "vllm":
        raise PlanError(f"{target.name} is not predictable for {target.kind} yet: only vLLM "
                        "engines are modelled")
    launch = read_launch(request.command)
    config = launch.config
    version = (request.version or "").strip() or launch.version_hint \
        or ((target.startup or {}).get("version") if target else None)
    if not version:
        raise PlanError("the vLLM release is not known: name it (e.g. 0.33.0)")
    try:
        rules = rules_for(version).rules
    except Unmodelled as why:
        raise PlanError(f"vLLM {version} cannot be planned: {why}") from None
    try:
        settings = settings_from_config(config)
        check_flags(settings, version)
    except FlagRejected as error:
        raise PlanError(str(error)) from None
    arch = _architecture(config.model, target)
    share = _share(ledger, target)
    same_model = target is not None and config.model == (target.config or {}).get("model")
    held_today = held_now(share)
    history = request.history or History()
    usage = _usage(share, settings, history if same_model else None)

    total = ledger["mem_total"]
    available = ledger.get("mem_available")
    cache = ledger.get("page_cache_reclaimable") or 0
    freed = held_today.value if held_today.known else None

    def free_at_boot(dropped: bool) -> int | None:
        if available is None or freed is None:
            return None
        seen = available + freed + (history.free_at_boot_offset or 0)
        return seen if rules.uma_free_is_available or dropped else max(seen - cache, 0)

    memory = BootMemory(total, free_at_boot(request.drop_page_cache))
    try:
        prediction = predict("vllm", version, settings, arch, memory, usage)
    except FlagRejected as error:
        raise PlanError(str(error)) from None
    pool = prediction.pool
    assert pool is not None
    refusal_dropped = None
    if pool.refusal and not request.drop_page_cache:
        refusal_dropped = startup_refusal(BootMemory(total, free_at_boot(True)),
                                          pool.utilization, rules) or ""

    if usage.weights_bytes is not None:
        weights_after = Figure(usage.weights_bytes, REPORTED,
                               "as the running engine reported" if (share or {}).get("weights")
                               is not None else "as the latest start of this model reported")
    elif prediction.weights.bytes is not None:
        weights_after = Figure(prediction.weights.bytes, prediction.weights.confidence,
                               prediction.weights.basis)
    else:
        weights_after = unknown("its weights are not known ("
                                + prediction.weights.confidence.removeprefix("unknown — ") + ")")
    graphs_after = _graphs_after(share, settings, same_model, history)
    pool_after = Figure(pool.bytes, pool.confidence, pool.basis) if pool.bytes is not None \
        else unknown(pool.confidence.removeprefix("unknown — "))
    held_after = _sum_figure((weights_after, pool_after, graphs_after))
    if pool.refusal:
        held_after = Figure(0, REPORTED, "it would not start, so it holds nothing")

    headroom_before, headroom_after = _headrooms(ledger, share, held_today, held_after)
    need_after = _need_after(share, prediction, settings, same_model, target)
    rows = _rows(ledger, engines, target, share, margin, headroom_before, headroom_after,
                 (weights_after, pool_after, graphs_after, need_after), prediction, pool.refusal)
    verdict, text = _verdict(rows, pool.refusal, refusal_dropped, headroom_after, held_after)
    largest = _largest_pool(ledger, share, margin, weights_after, graphs_after, held_today,
                            arch, settings, version, target)
    notes = []
    if graphs_after.value == 0 and graphs_after.confidence == ESTIMATE:
        notes.append(graphs_after.basis)
    return Plan(
        node=node.name, engine=target.name if target else "new engine", version=version,
        model=config.model, margin=margin, drop_page_cache=request.drop_page_cache,
        prediction=prediction, headroom=(headroom_before, headroom_after),
        page_cache=(_reported(ledger.get("page_cache_reclaimable"), "reclaimable page cache"),
                    Figure(0, ESTIMATE, "dropped before the start")
                    if request.drop_page_cache
                    else _reported(ledger.get("page_cache_reclaimable"), "as it is today")),
        held=(held_today, held_after), rows=rows, verdict=verdict, verdict_text=text,
        refusal_if_cache_dropped=refusal_dropped, largest=largest, ledger_at=ledger.get("at"),
        free_at_boot=_free_at_boot_figure(memory.free_at_boot_bytes, rules.uma_free_is_available,
                                          request.drop_page_cache, history),
        notes=notes + list(history.notes))


def _free_at_boot_figure(value: int | None, uma_available: bool, dropped: bool,
                         history: History) -> Figure:
    if value is None:
        return unknown("MemAvailable or what the engine holds today is not known")
    read = "MemAvailable" if uma_available else ("MemFree after the drop" if dropped
                                                 else "MemFree (MemAvailable less the page cache)")
    basis = f"{read} with what the engine holds today handed back"
    if history.free_at_boot_offset:
        basis += (f", {'+' if history.free_at_boot_offset >= 0 else '−'} "
                  f"{fixed_gib_text(abs(history.free_at_boot_offset))} as earlier starts read it")
    return Figure(value, ESTIMATE, basis)


def _target(engines: list[Engine], name: str | None) -> Engine | None:
    if not name:
        return None
    for engine in engines:
        if engine.name == name:
            return engine
    raise PlanError(f"no engine named {name!r} on this node")


def _architecture(model: str | None, target: Engine | None
                  ) -> Architecture | ArchitectureUnknown:
    """The model's architecture. Not knowing it is an error for a model no engine runs here
    (its weights are not known either); for the planned engine's own model the weights are
    what it reported, so the pool and the ledger are still planned and its KV tokens stay
    unknown with the reason."""
    same = target is not None and model == (target.config or {}).get("model")
    try:
        return architecture_for(model, target.model_config if same and target else None)
    except ArchitectureUnknown as why:
        if same:
            return why
        raise PlanError(f"unknown model {model or '(none named)'}: {why}") from None


def _share(ledger: dict, target: Engine | None) -> dict | None:
    if target is None:
        return None
    return next((s for s in ledger.get("engines", []) if s["engine_id"] == target.pk), None)


def held_now(share: dict | None) -> Figure:
    """What an engine holds now by its ledger share: its weights, pool and CUDA graphs, else
    what its process holds (an engine still loading); 0 for a new engine (no share)."""
    if share is None:
        return Figure(0, EXACT, "a new engine holds nothing yet")
    if share.get("reserved") is not None:
        return Figure(share["reserved"], REPORTED, "weights + KV pool + CUDA graphs")
    return _reported(share.get("actual"), "its memory")


def _usage(share: dict | None, settings: EngineSettings, history: History | None) -> Usage:
    """Weights and CUDA graphs of the same model: as the running engine reported them, else as
    its latest start did (``history``); nothing for another model."""
    if history is None:
        return Usage()
    weights = (share or {}).get("weights")
    graphs = None if settings.enforce_eager else (share or {}).get("cuda_graphs")
    if weights is not None:
        return Usage(weights_bytes=weights, cudagraph_bytes=graphs, basis="weights and CUDA "
                     "graphs as the running engine's start-up log reported")
    if history.weights_bytes is None:
        return Usage()
    return Usage(weights_bytes=history.weights_bytes,
                 cudagraph_bytes=None if settings.enforce_eager else history.cudagraph_bytes,
                 basis="weights and CUDA graphs as the latest start of this model reported")


def _graphs_after(share: dict | None, settings: EngineSettings, same_model: bool,
                  history: History) -> Figure:
    if settings.enforce_eager:
        return Figure(0, EXACT, "--enforce-eager captures no CUDA graphs")
    if same_model and share is not None and share.get("cuda_graphs") is not None:
        return Figure(share["cuda_graphs"], REPORTED, "as the running engine captured them")
    if same_model and history.cudagraph_bytes is not None:
        return Figure(history.cudagraph_bytes, REPORTED,
                      "as the latest start of this model captured them")
    return Figure(0, ESTIMATE, "CUDA graphs not known, counted as 0: they take a little more")


def _sum_figure(parts: tuple[Figure, ...]) -> Figure:
    missing = [p for p in parts if not p.known]
    if missing:
        return Figure(None, missing[0].confidence, missing[0].basis)
    confidence = REPORTED if all(p.confidence in (EXACT, REPORTED) for p in parts) \
        else ESTIMATE
    return Figure(sum(p.value for p in parts), confidence,  # type: ignore[misc]
                  "weights + KV pool + CUDA graphs")


def headroom_after(ledger: dict, share: dict | None, held_today: Figure,
                   held_after: Figure) -> Figure:
    """The room left once an engine that holds ``held_today`` (its ledger ``share``; None for
    one not in the ledger yet) holds ``held_after`` instead: the host's and, for an engine
    inside the memory budget, the budget's room, whichever is smaller."""
    return _headrooms(ledger, share, held_today, held_after)[1]


def _headrooms(ledger: dict, share: dict | None, held_today: Figure,
               held_after: Figure) -> tuple[Figure, Figure]:
    before = ledger.get("headroom")
    source = ledger.get("headroom_source") or "host"
    today = _reported(before, f"the lowest room in the last interval ({source})")
    if before is None or not held_today.known or not held_after.known:
        why = ("the headroom today is not known" if before is None
               else "what the engine holds after the change is not known: "
               + (held_after.basis if not held_after.known else held_today.basis))
        return today, unknown(why)
    delta = held_today.value - held_after.value  # type: ignore[operator]
    host = ledger.get("host_headroom")
    budget = ledger.get("budget_headroom")
    in_budget = share is not None and share.get("in_budget")
    known = [v for v in (None if host is None else host + delta,
                         None if budget is None else budget + (delta if in_budget else 0))
             if v is not None]
    confidence = ESTIMATE if held_after.confidence == ESTIMATE else REPORTED
    return today, Figure(min(known), confidence,
                         f"today's headroom {'+' if delta >= 0 else '−'} "
                         f"{fixed_gib_text(abs(delta))} the engine hands back or takes")


def _need_after(share: dict | None, prediction: EnginePrediction, settings: EngineSettings,
                same_model: bool, target: Engine | None) -> Figure:
    tokens_today = ((target.config or {}).get("max_num_batched_tokens") if target else None)
    if same_model and share is not None and share.get("prefill_need") is not None \
            and settings.max_num_batched_tokens == tokens_today:
        return Figure(share["prefill_need"], REPORTED if share["prefill_need_source"] ==
                      "observed" else ESTIMATE, f"today's need ({share['prefill_need_source']})")
    if prediction.prefill.bytes is None:
        return unknown(prediction.prefill.confidence.removeprefix("unknown — "))
    return Figure(prediction.prefill.bytes, prediction.prefill.confidence,
                  prediction.prefill.basis)


def _startup_figure(engine: Engine | None, key: str, what: str) -> Figure:
    value = (engine.startup or {}).get(key) if engine else None
    if engine is None:
        return unknown("a new engine has no start-up log yet")
    return Figure(value, REPORTED, f"its start-up log ({what})") if value is not None \
        else unknown(f"its start-up log did not print {what}")


def _rows(ledger: dict, engines: list[Engine], target: Engine | None, share: dict | None,
          margin: int, headroom_before: Figure, headroom_after: Figure,
          after_parts: tuple[Figure, Figure, Figure, Figure], prediction: EnginePrediction,
          refusal: str | None) -> list[EngineRow]:
    by_id = {e.pk: e for e in engines}
    rows = []
    shares = list(ledger.get("engines", []))
    if share is None:
        shares.append(None)  # the new engine
    for item in shares:
        planned = item is share
        engine = by_id.get(item["engine_id"]) if item else None
        name = engine.name if engine else (item["name"] if item else "new engine")
        before = (_reported(item.get("weights"), "weights"),
                  _reported(item.get("kv_pool"), "KV pool"),
                  _reported(item.get("cuda_graphs"), "CUDA graphs"),
                  _reported(item.get("prefill_need"), f"prefill need "
                            f"({item.get('prefill_need_source') or 'none'})")) if item \
            else (Figure(0, EXACT, "not running"),) * 3 + (unknown("not running"),)
        after = after_parts if planned else before
        kv_before = (_startup_figure(engine, "kv_cache_tokens", "the KV cache size in tokens"),
                     _startup_figure(engine, "max_concurrency", "the maximum concurrency"))
        if planned:
            kv = prediction.kv
            kv_after = (Figure(kv.tokens, kv.confidence, kv.basis) if kv.tokens is not None
                        else unknown(kv.confidence.removeprefix("unknown — ")),
                        Figure(kv.concurrency, kv.confidence, kv.basis)
                        if kv.concurrency is not None
                        else unknown(kv.confidence.removeprefix("unknown — ")))
        else:
            kv_after = kv_before
        fits = (prefill_fits(headroom_before.value, before[3].value, margin) if item else None,
                None if planned and refusal else
                prefill_fits(headroom_after.value, after[3].value, margin))
        verdict, text = _row_verdict(fits, planned, refusal, name)
        rows.append(EngineRow(name, planned, (before[0], after[0]), (before[1], after[1]),
                              (before[2], after[2]), (before[3], after[3]), fits,
                              (kv_before[0], kv_after[0]), (kv_before[1], kv_after[1]),
                              verdict, text))
    return rows


def _row_verdict(fits: tuple[bool | None, bool | None], planned: bool, refusal: str | None,
                 name: str) -> tuple[str, str]:
    if planned and refusal:
        return REFUSES, "would not start"
    before, after = fits
    if after is None:
        return UNKNOWN_VERDICT, "unknown — its prefill need or the headroom is not known"
    if after:
        return FITS, "its next prefill fits with margin"
    if before is False:
        return ALREADY_SQUEEZED, "its next prefill does not fit today either"
    return SQUEEZED, "its next prefill would no longer fit"


def _verdict(rows: list[EngineRow], refusal: str | None, refusal_dropped: str | None,
             headroom_after: Figure, held_after: Figure) -> tuple[str, str]:
    if refusal:
        text = f"The engine refuses to start: {refusal}."
        if refusal_dropped == "":
            text += " Dropping the page cache first would let it start."
        elif refusal_dropped:
            text += " Dropping the page cache first would not help."
        return REFUSES, text
    if headroom_after.value is not None and headroom_after.value < 0:
        return OUT_OF_MEMORY, (f"Host out of memory: the engine would take "
                               f"{held_after.gib_text} and leave "
                               f"{fixed_gib_text(headroom_after.value)} of room.")
    squeezed = [row.name for row in rows if not row.planned and row.verdict == SQUEEZED]
    if squeezed:
        return SQUEEZES, f"Starts, but squeezes {', '.join(squeezed)}'s prefill."
    own = next(row for row in rows if row.planned)
    if own.verdict == SQUEEZED or own.verdict == ALREADY_SQUEEZED:
        return SQUEEZED, "Starts, but its own next prefill would not fit with margin."
    if any(row.verdict == UNKNOWN_VERDICT for row in rows):
        return UNKNOWN_VERDICT, ("Starts; whether every prefill fits is unknown: a prefill "
                                 "need or the headroom is not known.")
    return FITS, "Fits: it starts and every engine's next prefill still fits with margin."


def _largest_pool(ledger: dict, share: dict | None, margin: int, weights: Figure,
                  graphs: Figure, held_today: Figure, arch: Architecture | ArchitectureUnknown,
                  settings: EngineSettings, version: str, target: Engine | None) -> LargestPool:
    """``pool <= room + held today - weights - CUDA graphs - margin - need`` for every
    neighbour, against the host's room and, for an engine inside the memory budget, the
    budget's (a budget the engine is outside is not moved by its pool)."""
    neighbours = [s for s in ledger.get("engines", []) if s is not share]
    needs = [(s["name"], s["prefill_need"]) for s in neighbours
             if s.get("prefill_need") is not None]

    def none(why: str) -> LargestPool:
        figure = unknown(why)
        return LargestPool(figure, figure, figure, f"unknown — {why}")

    if not needs:
        return none("no neighbour's prefill need is known")
    if not weights.known or not held_today.known:
        return none("the engine's weights or what it holds today are not known")
    rooms = []
    if ledger.get("host_headroom") is not None:
        rooms.append(("host", ledger["host_headroom"], True))
    if ledger.get("budget_headroom") is not None:
        rooms.append(("memory budget", ledger["budget_headroom"], bool(share and
                                                                      share.get("in_budget"))))
    if not rooms:
        return none("the headroom today is not known")
    limits = []
    for name, need in needs:
        for where, room, moves in rooms:
            if not moves:
                if room - margin < need:
                    return none(f"{name}'s prefill does not fit within the {where} whatever "
                                "the pool")
                continue
            limits.append((room + held_today.value - weights.value - graphs.value  # type: ignore
                           - margin - need, name, where))
    best, binding, where = min(limits)
    margin_text = f"margin {fixed_gib_text(margin)}"
    if best <= 0:
        return none(f"no pool leaves {binding}'s prefill room within the {where} "
                    f"({margin_text})")
    confidence = _weakest(weights.confidence if weights.confidence != REPORTED else EXACT,
                          graphs.confidence if graphs.confidence != REPORTED else EXACT)
    confidence = ESTIMATE if confidence == EXACT else confidence
    pool = Figure(best, confidence, f"bounded by {binding}'s prefill within the {where}, "
                  f"{margin_text}")
    if isinstance(arch, Architecture):
        kv = plan_kv(arch, replace(settings, kv_cache_memory_bytes=best), version, best)
    else:
        kv = unknown_plan(version, f"the architecture is not known: {arch}", best)
    tokens = Figure(kv.tokens, _weakest(confidence, kv.confidence), kv.basis) \
        if kv.tokens is not None else unknown(kv.confidence.removeprefix("unknown — "))
    concurrency = Figure(kv.concurrency, _weakest(confidence, kv.confidence), kv.basis) \
        if kv.concurrency is not None else unknown(kv.confidence.removeprefix("unknown — "))
    who = target.name if target else "the new engine"
    text = (f"{who} can take a KV pool of up to {fixed_gib_text(best)} "
            f"(--kv-cache-memory-bytes {best}) while every neighbour's prefill still fits: "
            f"{binding}'s prefill bounds it within the {where}, {margin_text}.")
    return LargestPool(pool, tokens, concurrency, text)
