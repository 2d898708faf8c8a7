"""Each start of an engine: what SparkOps predicted it would reserve, and what it reported.

After every engine collection, :func:`observe_starts` looks at each present engine's container
start (its id and start time: a recreated or restarted container is a new start):

* A start seen for the first time opens an :class:`~collectors.models.EngineStart`.
* While the engine is still loading (phase ``starting``, ``loading`` or ``profiling``: before it
  allocates its KV pool) and its vLLM release is known from its log, the start gets its
  prediction once: the fit planner's figures for the engine's own launch flags against the
  node's latest ledger (:func:`collectors.fitplan.plan`), corrected by what earlier starts
  measured (:func:`history_for`). A start first seen after its pool was allocated gets no
  prediction, saying so: a prediction made after the fact would measure nothing.
* Once the engine is ready, its start-up log's figures become the start's ``actual``; a start
  that fails, or whose container stops or is replaced before it is ready, ends so. A rank of an
  engine that spans nodes and serves no API is ready once its head serves.

The predicted-squeeze alert reads the open starts' predictions (``dashboard.alerting``); the
engine page shows each figure's error (:func:`figure_errors`).

Self-correction from history (each correction is named in ``EngineStart.corrections``):

* weights and CUDA graphs: a recreated container has not loaded anything yet, so its ledger
  share has no weights; the latest ready start of the same engine and model tells them;
* free memory at boot: what vLLM read at boot (its ``Initial free memory`` / ``Free memory on
  device`` line) less what was predicted, the median over the node's latest starts, is added
  to the next prediction: a node whose page cache or neighbours keep churning at boot reads
  less free memory than its ledger shows, which moves a profiled pool;
* time to ready: the median of the engine's latest ready starts.
"""

from __future__ import annotations

import logging
import shlex
import statistics
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection

from collectors.fitplan import Figure, History, Plan, PlanError, PlanRequest, plan
from collectors.ledger import LOADING_PHASES, engine_share
from collectors.models import Engine, EngineStart, Node
from sparkops.units import GIB, fixed_gib_text

log = logging.getLogger(__name__)

ENDED_PHASES = {"failed": EngineStart.Outcome.FAILED, "stopped": EngineStart.Outcome.GONE,
                "gone": EngineStart.Outcome.GONE}
# Corrections follow the latest starts: enough to shrug off one odd boot, few enough to follow a
# change of the node (a new neighbour, a driver update).
LEARN_FROM_LATEST = 5
# The planner's own margin is the alert's business; the prediction of one engine needs none.
NO_MARGIN = 0
FIGURES = ("weights", "kv_pool", "cuda_graphs", "held", "kv_tokens", "concurrency",
           "prefill_need", "free_at_boot", "startup_seconds")
FIGURE_WORDS = {
    "weights": "weights", "kv_pool": "KV pool", "cuda_graphs": "CUDA graphs",
    "held": "memory held (weights + KV pool + CUDA graphs)", "kv_tokens": "KV tokens",
    "concurrency": "maximum concurrency", "prefill_need": "prefill need",
    "free_at_boot": "free memory at boot", "startup_seconds": "time to ready",
}
BYTE_FIGURES = {"weights", "kv_pool", "cuda_graphs", "held", "prefill_need", "free_at_boot"}


def observe_starts(node: Node, engines: Iterable[Engine], now: datetime) -> list[EngineStart]:
    """Open, predict and close the starts of ``node``'s present ``engines``; end the open
    starts of engines no longer present. Returns the starts still open (engines loading).
    Cost: one query for the present engines' starts and the node's open ones, then a write per
    start that changed and one for the open starts that ended unseen, if any."""
    present = [engine for engine in engines
               # A model adopted from a router starts inside the router's container.
               if not (engine.config or {}).get("router")]
    read = starts_to_look_at(node, [engine.start_identity for engine in present])
    known = {(start.engine_id, start.identity): start for start in read}
    seen_ids = set()
    still_open = []
    for engine in present:
        start = known.get((engine.pk, engine.start_identity))
        if start is None:
            if engine.container_state != "running":
                continue  # a stopped container is not starting
            start = EngineStart.objects.create(
                engine=engine, node=node, identity=engine.start_identity,
                container_started_at=engine.started_at, seen_at=now,
                model=(engine.config or {}).get("model") or "", config=engine.config or {})
        seen_ids.add(start.pk)
        _advance(start, engine, node, present, now)
        if start.outcome == EngineStart.Outcome.STARTING:
            still_open.append(start)
    # A start still open whose engine is gone, or that a newer start of its engine replaced.
    unseen = [start.pk for start in read
              if start.outcome == EngineStart.Outcome.STARTING and start.pk not in seen_ids]
    if unseen:
        (EngineStart.objects.filter(pk__in=unseen, outcome=EngineStart.Outcome.STARTING)
         .update(outcome=EngineStart.Outcome.GONE, finished_at=now))
    return still_open


def starts_to_look_at(node: Node, identities: list[str]) -> list[EngineStart]:
    """The node's starts with one of ``identities`` and its open ones, in no order (each is
    looked up by its engine and identity): the ORM's ``filter(Q(identity__in=identities) |
    Q(outcome=STARTING), node=node)``.

    Cost: one query, written here: the ORM spent twice the CPU of reading the rows building it
    and ordering them by the model's order (four engines' starts: 0.65 ms through the ORM, 0.23
    ms so), after every engine collection.
    """
    quote = connection.ops.quote_name
    meta = EngineStart._meta

    def column(name: str) -> str:
        return quote(meta.get_field(name).column)

    wanted = f"{column('outcome')} = %s"
    if identities:  # an empty IN list is not SQL; the ORM leaves the condition out
        wanted = f"{column('identity')} IN ({', '.join(['%s'] * len(identities))}) OR {wanted}"
    return list(EngineStart.objects.raw(
        f"SELECT * FROM {quote(meta.db_table)} WHERE {column('node')} = %s AND ({wanted})",
        [node.pk, *identities, EngineStart.Outcome.STARTING]))


def _advance(start: EngineStart, engine: Engine, node: Node, engines: list[Engine],
             now: datetime) -> None:
    if start.outcome != EngineStart.Outcome.STARTING:
        return
    before = (start.version, start.no_prediction, start.predicted_at, start.outcome)
    version = (engine.startup or {}).get("version") or ""
    if version and start.version != version:
        start.version = version
    if not start.predicted and not start.no_prediction:
        if engine.phase in LOADING_PHASES:
            if engine.kind != "vllm":
                start.no_prediction = (f"only vLLM's reservation is modelled, not "
                                       f"{engine.kind}'s")
            elif version:
                _predict(start, engine, node, engines, now)
        elif engine.phase != "unknown":
            start.no_prediction = (
                f"SparkOps first saw this start in phase {engine.phase}, after its KV pool "
                "was allocated" if start.seen_at == now else
                "its log named no vLLM release before its KV pool was allocated")
    if engine.phase == "ready" or _rank_of_a_serving_engine(engine):
        start.outcome = EngineStart.Outcome.READY
        start.finished_at = now
        start.actual = actual_figures(engine, start, now)
    elif engine.phase in ENDED_PHASES:
        start.outcome = ENDED_PHASES[engine.phase]
        start.finished_at = now
    if (start.version, start.no_prediction, start.predicted_at, start.outcome) != before:
        start.save()


def _rank_of_a_serving_engine(engine: Engine) -> bool:
    """A rank of an engine that spans nodes which serves no API of its own (a headless rank,
    a Ray worker: ``collectors.spanning``) never logs "ready": its start is ready once it is
    past loading and a head of its engine serves (one query, for such ranks only)."""
    span = engine.span or {}
    if not engine.span_key or span.get("serves_api") is not False \
            or engine.phase in (*LOADING_PHASES, "unknown") or engine.phase in ENDED_PHASES:
        return False
    return Engine.objects.filter(span_key=engine.span_key, span__role="head", present=True,
                                 phase="ready").exists()


def _predict(start: EngineStart, engine: Engine, node: Node, engines: list[Engine],
             now: datetime) -> None:
    history = history_for(engine, node, exclude=start)
    node.refresh_from_db(fields=["ledger"])  # the host-memory collection's latest, not ours
    command = engine.command if isinstance(engine.command, list) else [str(engine.command)]
    try:
        result = plan(node, engines, PlanRequest(engine.name, shlex.join(command),
                                                 start.version, history=history), NO_MARGIN)
    except PlanError as why:
        start.no_prediction = str(why)
        return
    start.predicted = predicted_figures(result, startup_seconds(engine, exclude=start))
    start.predicted_at = now
    start.corrections = list(history.notes)


def predicted_figures(result: Plan, startup: Figure) -> dict[str, dict[str, Any]]:
    """The planned engine's own figures of a plan, as a start stores them."""
    row = next(row for row in result.rows if row.planned)
    figures = {
        "weights": row.weights[1], "kv_pool": row.kv_pool[1], "cuda_graphs": row.cuda_graphs[1],
        "held": result.held[1], "kv_tokens": row.kv_tokens[1],
        "concurrency": row.concurrency[1], "prefill_need": row.prefill_need[1],
        "free_at_boot": result.free_at_boot, "startup_seconds": startup,
    }
    stored = {name: _stored(figure) for name, figure in figures.items()}
    pool = result.prediction.pool
    if pool is not None and pool.refusal:
        stored["refusal"] = {"value": None, "confidence": pool.confidence, "basis": pool.refusal}
    return stored


def actual_figures(engine: Engine, start: EngineStart, now: datetime) -> dict[str, dict]:
    """What the ready engine reported, in the prediction's figures: its parts as the ledger
    reads them (:func:`collectors.ledger.engine_share`: the pool from its metrics, exact, before
    its log's two decimals), the rest from its start-up log."""
    log_ = engine.startup or {}
    share = engine_share(engine)

    def reported(value: float | int | None, what: str, source: str) -> Figure:
        return Figure(None, f"unknown — it did not report {what}", what) if value is None \
            else Figure(value, "reported", source)

    weights = reported(share.weights, "its weights", "its start-up log")
    pool = reported(share.kv_pool, "its KV pool", "its metrics or start-up log")
    graphs = reported(share.cuda_graphs, "its CUDA graph memory", "its start-up log")
    held = reported(share.reserved, "all of weights, KV pool and CUDA graphs",
                    "weights + KV pool + CUDA graphs")
    free = log_.get("startup_free_gib")
    seconds = log_.get("startup_seconds")
    source = "its start-up log"
    if seconds is None and start.container_started_at is not None and start.seen_at < now:
        # Only for a start SparkOps saw before it was ready: for one first seen ready, the
        # container's age is its uptime, not its time to ready.
        seconds, source = (now - start.container_started_at).total_seconds(), \
            "container start to ready, as SparkOps saw it"
    return {name: _stored(figure) for name, figure in {
        "weights": weights, "kv_pool": pool, "cuda_graphs": graphs, "held": held,
        "kv_tokens": reported(log_.get("kv_cache_tokens"), "its KV cache size in tokens",
                              "its start-up log"),
        "concurrency": reported(log_.get("max_concurrency"), "its maximum concurrency",
                                "its start-up log"),
        "free_at_boot": reported(None if free is None else int(free * GIB),
                                 "the free memory it read at boot", "its start-up log"),
        "startup_seconds": reported(None if seconds is None else round(seconds, 1),
                                    "when it started", source),
    }.items()}


def _stored(figure: Figure) -> dict[str, Any]:
    return {"value": figure.value, "confidence": figure.confidence, "basis": figure.basis}


# --- history ------------------------------------------------------------------------------------


def _ready_starts(**filters: Any) -> list[EngineStart]:
    return list(EngineStart.objects.filter(outcome=EngineStart.Outcome.READY, **filters)
                .order_by("-finished_at", "-pk")[:LEARN_FROM_LATEST])


def history_for(engine: Engine, node: Node, exclude: EngineStart | None = None) -> History:
    """What the latest starts measured that corrects this engine's next prediction."""
    model = (engine.config or {}).get("model") or ""
    own = [s for s in _ready_starts(engine=engine, model=model) if s != exclude]
    notes = []
    weights = graphs = None
    if own:
        weights = _value(own[0].actual, "weights")
        graphs = _value(own[0].actual, "cuda_graphs")
        if weights is not None:
            notes.append(f"weights {fixed_gib_text(weights)} and CUDA graphs as the start of "
                         f"{own[0].finished_at:%Y-%m-%d %H:%M} UTC reported, where the running "
                         "engine reports none yet")
    offsets = [actual - predicted for s in _ready_starts(node=node) if s != exclude
               for predicted, actual in [(_value(s.predicted, "free_at_boot"),
                                          _value(s.actual, "free_at_boot"))]
               if predicted is not None and actual is not None]
    offset = int(statistics.median(offsets)) if offsets else None
    if offset:
        notes.append(f"free memory at boot {'+' if offset >= 0 else '−'} "
                     f"{fixed_gib_text(abs(offset))}: what vLLM read at boot against the "
                     f"prediction, median of the node's latest {len(offsets)} "
                     f"start{'s' * (len(offsets) != 1)}")
    return History(weights_bytes=weights, cudagraph_bytes=graphs, free_at_boot_offset=offset,
                   notes=tuple(notes))


def startup_seconds(engine: Engine, exclude: EngineStart | None = None) -> Figure:
    """Time to ready: the median of the engine's latest ready starts."""
    measured = [value for s in _ready_starts(engine=engine) if s != exclude
                for value in [_value(s.actual, "startup_seconds")] if value is not None]
    if not measured:
        return Figure(None, "unknown — no earlier start of it was measured",
                      "no earlier start of it was measured")
    return Figure(round(float(statistics.median(measured)), 1), "estimate",
                  f"median of its latest {len(measured)} start{'s' * (len(measured) != 1)}")


def _value(figures: dict, name: str) -> Any:
    return (figures.get(name) or {}).get("value")


# --- how close a prediction was ------------------------------------------------------------------


def figure_errors(start: EngineStart) -> list[dict[str, Any]]:
    """Each figure predicted and measured: both values in words and the error, actual against
    predicted ("+4.2 %"); a figure either side left unknown says so instead of an error."""
    rows = []
    for name in FIGURES:
        predicted, actual = start.predicted.get(name), start.actual.get(name)
        if not predicted and not actual:
            continue
        p, a = _value(start.predicted, name), _value(start.actual, name)
        rows.append({
            "name": name, "label": FIGURE_WORDS[name],
            "predicted": figure_text(name, predicted), "actual": figure_text(name, actual),
            "predicted_value": p, "actual_value": a,
            "error": error_text(p, a),
            "error_fraction": None if p is None or a is None or p == 0 else (a - p) / p,
        })
    return rows


def figure_text(name: str, figure: dict | None) -> str:
    if not figure:
        return "unknown — not recorded"
    value = figure.get("value")
    if value is None:
        return figure.get("confidence") or "unknown"
    if name in BYTE_FIGURES:
        return fixed_gib_text(value)
    if name == "startup_seconds":
        return f"{value:,.0f} s"
    return f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"


def error_text(predicted: float | None, actual: float | None) -> str:
    if predicted is None or actual is None:
        return "unknown — " + ("not predicted" if predicted is None else "not measured")
    if predicted == actual:
        return "exact"
    if predicted == 0:
        return "predicted 0"
    return f"{(actual - predicted) / predicted:+.1%}"


def accuracy_text(start: EngineStart) -> str:
    """One line for a resolved notice: how close the main figures came."""
    parts = []
    for row in figure_errors(start):
        if row["name"] in ("kv_pool", "held", "kv_tokens", "weights") \
                and row["predicted_value"] is not None:
            parts.append(f"{row['label']} predicted {row['predicted']}, actual {row['actual']} "
                         f"({row['error']})")
    return "; ".join(parts) if parts else "no figure was both predicted and measured"
