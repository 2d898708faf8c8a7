"""Demo mode, the story: the seeds' acts told on one node while SparkOps watches.

0. **steady**: both engines serve their traffic; SparkOps learns their memory and speeds.
1. **squeeze**: the neighbour (nemotron) is recreated with its KV pool 8 → 24 GiB (scaled), so
   gemma's next prefill no longer fits: with the rule's margin fitted to this machine's headroom
   (:func:`squeeze_margin`), a ``prefill-squeeze`` alert fires for gemma; later the neighbour
   goes back to 8 GiB and the alert resolves.
2. **document**: a 48,508-token document stalls gemma's other requests while it prefills.
3. **restart**: a planned restart of gemma, now, carried out by the stack's worker.

The story sits above both halves of SparkOps: it drives the engines (:mod:`sparkops.demo.node`)
and reads what the collectors, alerting and restarts made of them, through their models.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from collectors.models import Engine, Node
from dashboard.alerting.models import Alert, RuleSetting
from dashboard.alerting.settings import rule_defaults
from dashboard.restarts.models import Restart
from dashboard.restarts.planning import PlanRefused, clock, plan_restart
from sparkops.demo.node import (
    DOCUMENT_TOKENS,
    ENGINES,
    GEMMA,
    NEIGHBOUR_GROWN_KV_GIB,
    NEMOTRON,
    Containers,
    EngineSpec,
    Scale,
    complete,
    engine_command,
    engine_labels,
    healthy,
)
from sparkops.testing.ports import free_port
from sparkops.units import GIB, MIB

ACTS = ("squeeze", "document", "restart")
SQUEEZE_RULE = "prefill-squeeze"
STALL_RULE = "prefill-stall"
# The story's pauses at speed 1, in seconds: a few minutes per act.
STEADY_SECONDS = 120.0
SQUEEZE_SECONDS = 180.0
REVERT_SECONDS = 120.0
DOCUMENT_SECONDS = 120.0
AFTER_RESTART_SECONDS = 60.0
# Waits for SparkOps itself are real time whatever the speed: a collection every few seconds, a
# rule's "for", a restart's drain and start-up.
ENGINE_READY_SECONDS = 120.0
DISCOVERY_SECONDS = 120.0
ALERT_SECONDS = 120.0
RESTART_SECONDS = 30 * 60.0
# The margin is calibrated from the median headroom of this many collections; their spread
# (highest − lowest) is the machine's own noise, which other programs make.
CALIBRATION_SAMPLES = 5
# The headroom after the growth should sit at least this many spreads from either need, so
# that the machine's noise neither hides the squeeze nor squeezes the neighbour too.
NOISE_SPREADS = 3
# RuleSetting fields the demo may change; they are put back as found when the story ends.
RESTORED_FIELDS = ("enabled", "for_seconds", "repeat_seconds", "thresholds", "updated_at",
                   "updated_by")
FRESH_START_REASON = ("Demo: fresh containers for this run of the demo (the demo removed the "
                      "previous run's and creates its engines anew)")
# The squeeze act's cause look-back: the alert fires well within a minute of the growth (its
# 10 s "for" after a collection or two). The rule takes no less than a minute.
CAUSE_LOOKBACK_MINUTES = 1.0
# The squeeze starts at least this long after SparkOps saw both engines up (their last loading
# step is recorded by then): the look-back. Calibrating and recreating the neighbour take a few
# collections more before the alert fires, so the start is out of the look-back by then.
START_CLEARANCE_SECONDS = CAUSE_LOOKBACK_MINUTES * 60


@dataclass(frozen=True)
class SqueezeLine:
    """What the calibration expects of the squeeze act: the headroom once the neighbour grew,
    and the headroom below which gemma's alert fires (its margin plus gemma's prefill need)."""

    expected: int
    firing: int


class StoryInterrupted(Exception):
    """The story stops: Ctrl-C, or the stack exited (``failed``)."""

    def __init__(self, reason: str, *, failed: bool = False) -> None:
        super().__init__(reason)
        self.failed = failed


class Pacer(Protocol):
    """Lets story time pass while SparkOps collects (the real stack, or a test's cycles)."""

    def pause(self, seconds: float) -> None: ...


def _gib(value: float | None) -> str:
    return "unknown" if value is None else f"{value / GIB:.2f} GiB"


class Story:
    """The seeds' story, act by act, on one node, told through ``say``.

    ``containers`` creates the engine containers (on the storage the node's container engine
    API serves); ``pace`` lets time pass while SparkOps collects. Waits for SparkOps return
    False after their timeout and the story goes on: a demo never stops on a late alert.
    """

    def __init__(self, *, node: Node, containers: Containers, scale: Scale, speed: float,
                 pace: Pacer, say: Callable[[str], None],
                 ports: dict[str, int] | None = None,
                 alert_seconds: float = ALERT_SECONDS) -> None:
        self.node_id = node.pk
        self.containers = containers
        self.scale = scale
        self.speed = speed
        self.pace = pace
        self.say = say
        self.ports = ports or {spec.name: free_port() for spec in ENGINES}
        self.alert_seconds = alert_seconds
        self.engines_up: float | None = None  # monotonic: when SparkOps saw both engines
        self.squeeze_line: SqueezeLine | None = None  # set by the calibration
        self.lowest_after_growth: int | None = None  # the headroom recorded in the squeeze act

    # --- helpers ---------------------------------------------------------------------------
    def story_seconds(self, seconds_at_speed_1: float) -> float:
        """A pause of the story at this speed."""
        return seconds_at_speed_1 / self.speed

    def until(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Let time pass until ``condition()`` holds (True) or ``timeout`` seconds went (False)."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                return False
            self.pace.pause(1.0)
        return True

    def rest_of(self, started: float, seconds_at_speed_1: float) -> None:
        """Pause for what is left of an act that began at ``started`` (monotonic)."""
        left = self.story_seconds(seconds_at_speed_1) - (time.monotonic() - started)
        if left > 0:
            self.pace.pause(left)

    @property
    def node(self) -> Node:
        """The node, as the stack last wrote it (ledger included)."""
        return Node.objects.get(pk=self.node_id)

    def engine(self, spec: EngineSpec) -> Engine | None:
        """SparkOps' row for ``spec``'s engine, once discovered."""
        return Engine.objects.filter(node_id=self.node_id, name=spec.name).first()

    def share(self, spec: EngineSpec) -> dict[str, Any] | None:
        """``spec``'s part of the node's latest ledger."""
        return next((s for s in (self.node.ledger or {}).get("engines", [])
                     if s.get("name") == spec.name), None)

    # --- engines ---------------------------------------------------------------------------
    def start_engine(self, spec: EngineSpec, kv_gib: float | None = None) -> bool:
        """Run ``spec``'s container and wait until it is ready (``/health``); ready in time?"""
        port = self.ports[spec.name]
        self.containers.run(spec.name,
                            engine_command(spec, self.scale, port=port, speed=self.speed,
                                           kv_gib=kv_gib),
                            engine_labels(spec, self.scale))
        ready = self.until(lambda: healthy(port), ENGINE_READY_SECONDS)
        if not ready:
            self.say(f"{spec.name} did not answer /health within {ENGINE_READY_SECONDS:.0f} s; "
                     f"see its log on its engine page")
        return ready

    def launch(self) -> None:
        """Start both engines one after the other: two engines starting together break each
        other's memory profiling, so the second starts once the first is ready."""
        for spec in ENGINES:
            self.say(f"Starting {spec.name} ({spec.model}): weights {spec.weights_gib:g} GiB, "
                     f"KV pool {spec.kv_gib:g} GiB, prefill buffer {spec.prefill_gib:g} GiB "
                     f"(8,192 tokens) on a GB10 — {self.scale.bytes(spec.weights_gib) / MIB:.0f}"
                     f" + {self.scale.bytes(spec.kv_gib) / MIB:.0f} + "
                     f"{self.scale.bytes(spec.prefill_gib) / MIB:.0f} MiB here; port "
                     f"{self.ports[spec.name]}")
            self.start_engine(spec)

    def engines_known(self) -> bool:
        """Both engines discovered, ready, and in the ledger with their KV pools."""
        for spec in ENGINES:
            engine = self.engine(spec)
            share = self.share(spec)
            if engine is None or not engine.present or engine.phase != "ready" or not share \
                    or not share.get("kv_pool"):
                return False
        return True

    def wait_for_engines(self) -> bool:
        """Wait until SparkOps knows both engines (see :meth:`engines_known`); in time?"""
        found = self.until(self.engines_known, DISCOVERY_SECONDS)
        self.engines_up = time.monotonic()
        if found:
            self.say("SparkOps found both engines through the Docker Engine API (labels "
                     "sparkops.engine=vllm, sparkops.manage=true): see the overview.")
        else:
            self.say(f"SparkOps did not see both engines ready within {DISCOVERY_SECONDS:.0f} s;"
                     " the overview says why (discovery error, engine phase).")
        return found

    # --- acts ------------------------------------------------------------------------------
    def act_steady(self) -> None:
        """Both engines serve while SparkOps learns their memory, speeds and prefill needs."""
        self.say(f"Act 0 — steady: gemma serves light steady traffic (decode ~{GEMMA.decode_tps:g}"
                 f" tok/s per stream, prefill ~{GEMMA.prefill_tps:,.0f} tok/s), nemotron a little"
                 f" (~{NEMOTRON.decode_tps:g} / ~{NEMOTRON.prefill_tps:,.0f} tok/s). Both really "
                 "hold their (scaled) memory: see the ledger and the engine pages.")
        self.pace.pause(self.story_seconds(STEADY_SECONDS))

    def clear_of_start(self) -> None:
        """Let the engines' start pass out of the rule's cause look-back before the squeeze.

        The start is growth too (each engine's pool and weights appearing), and larger than the
        neighbour's: within the look-back it would be named as what squeezed gemma. At speed 1
        the steady act outlasts the look-back; a faster story waits here.
        """
        if self.engines_up is None:
            return
        left = START_CLEARANCE_SECONDS - (time.monotonic() - self.engines_up)
        if left > 0:
            self.say(f"Waiting {left:.0f} s so that the engines' start is out of the "
                     f"prefill-squeeze rule's {CAUSE_LOOKBACK_MINUTES:g}-minute cause look-back "
                     "(a faster story than the rule's smallest look-back).")
            self.pace.pause(left)

    def calibrate_squeeze(self) -> float | None:
        """Set the prefill-squeeze margin so that the scaled growth crosses it; the margin (GiB).

        On the GB10 the 16 GiB growth took headroom 30 → 14 GiB: below gemma's 14 GiB need plus
        the default 2 GiB margin, while the neighbour's own 8 GiB need still fitted. This
        machine's headroom is whatever it is, so the margin is fitted to it (see
        :func:`squeeze_margin`).
        """
        samples: list[int] = []
        seen: set[str] = set()
        sources: set[str] = set()

        def sampled() -> bool:
            ledger = self.node.ledger or {}
            if ledger.get("at") not in seen and ledger.get("headroom") is not None:
                seen.add(ledger["at"])
                samples.append(ledger["headroom"])
                sources.add(ledger.get("headroom_source") or "host")
            return len(samples) >= CALIBRATION_SAMPLES

        sampled_in_time = self.until(sampled, self.alert_seconds)
        at_risk, neighbour = self.share(GEMMA), self.share(NEMOTRON)
        if not sampled_in_time or not at_risk or not at_risk.get("prefill_need"):
            self.say("Could not calibrate the prefill-squeeze rule (no headroom or prefill need "
                     "in the ledger yet); the squeeze act may not raise an alert.")
            return None
        headroom = int(statistics.median(samples))
        spread = max(samples) - min(samples)
        need = at_risk["prefill_need"]
        neighbour_need = (neighbour or {}).get("prefill_need") or 0
        growth = self.scale.neighbour_growth_bytes
        margin, hysteresis = squeeze_margin(headroom, need, neighbour_need, growth)
        before_room, after_room = squeeze_room(headroom, margin, need, neighbour_need, growth)
        margin_gib, hysteresis_gib = round(margin / GIB, 3), round(hysteresis / GIB, 3)
        self.squeeze_line = SqueezeLine(expected=headroom - growth,
                                        firing=int(margin_gib * GIB) + need)
        setting, _ = RuleSetting.objects.get_or_create(rule=SQUEEZE_RULE)
        # Causes are looked for only since just before this act, so that the engines' first
        # start (and an earlier demo run) are not named as what squeezed gemma now.
        setting.thresholds = {**(setting.thresholds or {}), "margin_gib": margin_gib,
                              "hysteresis_gib": hysteresis_gib,
                              "lookback_minutes": CAUSE_LOOKBACK_MINUTES}
        setting.updated_at = timezone.now()
        setting.save(update_fields=["thresholds", "updated_at"])
        default = rule_defaults(SQUEEZE_RULE).threshold_spec("margin_gib").default
        # Within the engines' memory budget only they move the room; else the whole machine.
        within = sources == {"budget"}
        where = "The engines' memory budget has" if within else "This machine has"
        self.say(
            "Calibrated the prefill-squeeze rule (Rules page). On the GB10 of the story headroom "
            f"fell 30 → 14 GiB: minus the default {default:g} GiB margin, below gemma's "
            f"{GEMMA.prefill_gib:g} GiB prefill need, while nemotron's {NEMOTRON.prefill_gib:g} "
            f"GiB still fitted. {where} {_gib(headroom)} of headroom (median of "
            f"{len(samples)} collections), gemma needs {_gib(need)} "
            f"({at_risk.get('prefill_need_source')}), nemotron {_gib(neighbour_need)}, and the "
            f"neighbour will grow by {_gib(growth)}: with the margin at {margin_gib:.3f} GiB "
            f"(hysteresis {hysteresis_gib:.3f} GiB) the scaled growth does the same here. "
            f"Causes are looked for in the last {CAUSE_LOOKBACK_MINUTES * 60:.0f} s.")
        self.say(noise_verdict(spread, len(samples), before_room, after_room,
                               within_budget=within))
        return margin_gib

    @property
    def squeeze_hidden(self) -> bool:
        """Whether the last squeeze act's growth never took the recorded headroom below the
        firing line: other programs gave memory back meanwhile, so there was nothing to fire."""
        line, lowest = self.squeeze_line, self.lowest_after_growth
        return line is not None and lowest is not None and lowest >= line.firing

    def squeeze_missed(self) -> str:
        """Why no alert fired, told from the lowest headroom recorded after the growth."""
        line, lowest = self.squeeze_line, self.lowest_after_growth
        if line is None or lowest is None:
            return "this machine's headroom moved by something else meanwhile (see the ledger)."
        if lowest < line.firing:
            return (f"the headroom fell to {_gib(lowest)}, below the {_gib(line.firing)} at which "
                    "it fires, yet no alert fired: see the Alerts page and the rule's history.")
        return (f"the lowest headroom after the growth was {_gib(lowest)}, not the "
                f"{_gib(line.expected)} the calibration expected: other programs gave back "
                f"{_gib(lowest - line.expected)} meanwhile, more than the "
                f"{_gib(line.firing - line.expected)} of room below the firing line "
                f"({_gib(line.firing)}; see the ledger).")

    def _open_squeeze(self) -> Alert | None:
        """gemma's firing prefill-squeeze alert, if any."""
        engine = self.engine(GEMMA)
        return Alert.objects.filter(rule=SQUEEZE_RULE, engine=engine, state="firing").first() \
            if engine else None

    def act_squeeze(self) -> Alert | None:
        """The neighbour grows, gemma's prefill is squeezed, and back; the alert, if it fired."""
        started = time.monotonic()
        before = self.scale.bytes(NEMOTRON.kv_gib)
        after = self.scale.bytes(NEIGHBOUR_GROWN_KV_GIB)
        self.say(f"Act 1 — the neighbour grows: nemotron is recreated by its owner with "
                 f"--kv-cache-memory-bytes for {NEIGHBOUR_GROWN_KV_GIB:g} GiB instead of "
                 f"{NEMOTRON.kv_gib:g} ({before / MIB:.0f} → {after / MIB:.0f} MiB here). KV pools"
                 " are reserved at start, so the headroom falls for good and gemma's next "
                 "prefill buffer no longer fits. SparkOps did not plan this "
                 "restart: it records it as unplanned.")
        self.containers.remove(NEMOTRON.name)
        self.start_engine(NEMOTRON, kv_gib=NEIGHBOUR_GROWN_KV_GIB)
        self.lowest_after_growth = None

        def fired() -> bool:
            headroom = (self.node.ledger or {}).get("headroom")
            if headroom is not None:
                self.lowest_after_growth = min(headroom, self.lowest_after_growth or headroom)
            return self._open_squeeze() is not None

        self.until(fired, self.alert_seconds)
        alert = self._open_squeeze()
        if alert is not None:
            self.say(f"prefill-squeeze FIRING for gemma (Alerts page): {alert.summary}")
        else:
            self.say(f"No prefill-squeeze alert within {self.alert_seconds:.0f} s: "
                     f"{self.squeeze_missed()}")
        self.rest_of(started, SQUEEZE_SECONDS)

        started = time.monotonic()
        self.say(f"Act 1, later — the neighbour goes back: nemotron recreated with its "
                 f"{NEMOTRON.kv_gib:g} GiB pool ({before / MIB:.0f} MiB here); the headroom "
                 "returns and the alert resolves once it is back past the hysteresis.")
        self.containers.remove(NEMOTRON.name)
        self.start_engine(NEMOTRON)
        if alert is not None:
            pk = alert.pk
            resolved = self.until(
                lambda: Alert.objects.filter(pk=pk, state="resolved").exists(),
                self.alert_seconds)
            self.say("prefill-squeeze resolved." if resolved else
                     f"prefill-squeeze still open after {self.alert_seconds:.0f} s.")
        self.rest_of(started, REVERT_SECONDS)
        return alert

    def act_document(self) -> float | None:
        """A long document stalls gemma; how long its answer took (None: it failed)."""
        started, began_at = time.monotonic(), timezone.now()
        seconds = DOCUMENT_TOKENS / GEMMA.prefill_tps
        self.say(f"Act 2 — a long document: someone pastes a {DOCUMENT_TOKENS:,}-token document "
                 f"into gemma (POST /v1/completions, sparkops_prompt_tokens={DOCUMENT_TOKENS}). "
                 "vLLM V1 has no concurrent partial prefill, so everyone else on gemma waits: "
                 f"~{seconds:.0f} s here at a constant {GEMMA.prefill_tps:,.0f} tok/s (83 s on "
                 "the GB10, where prefill slows as the context grows; the emulator does not "
                 "model that).")
        result: dict[str, Any] = {}

        def post() -> None:
            t0 = time.monotonic()
            try:
                complete(self.ports[GEMMA.name], GEMMA.name, DOCUMENT_TOKENS)
                result["seconds"] = time.monotonic() - t0
            except OSError as error:  # URLError is an OSError
                result["error"] = str(error)

        thread = threading.Thread(target=post, name="demo-document", daemon=True)
        thread.start()
        self.until(lambda: not thread.is_alive(), seconds + self.alert_seconds)
        if "seconds" in result:
            self.say(f"The document was answered after {result['seconds']:.0f} s.")
        else:
            self.say(f"The document was not answered: {result.get('error', 'still running')}")
        engine = self.engine(GEMMA)
        stall = self.until(lambda: Alert.objects.filter(
            rule=STALL_RULE, engine=engine, fired_at__isnull=False,
            started_at__gte=began_at).exists(), 30)
        if stall:
            alert = Alert.objects.filter(rule=STALL_RULE, engine=engine).first()
            self.say(f"prefill-stall (Alerts page; the stall is kept on gemma's timeline): "
                     f"{alert.summary if alert else ''}")
        self.rest_of(started, DOCUMENT_SECONDS)
        return result.get("seconds")

    def act_restart(self) -> Restart | None:
        """A planned restart of gemma, now, run by the node's worker; the restart."""
        started = time.monotonic()
        engine = self.engine(GEMMA)
        user = get_user_model().objects.filter(is_superuser=True, is_active=True) \
            .order_by("pk").first()
        if engine is None or user is None:
            self.say("Act 3 skipped: no gemma engine or no admin account.")
            return None
        try:
            restart = plan_restart(engine, user=user, now=timezone.now(),
                                   reason="Demo: planned restart of gemma (about ten minutes on "
                                          "a GB10; the emulator starts faster)")
        except PlanRefused as refused:
            self.say(f"Act 3 — the planned restart of gemma was refused: {refused.reason}")
            return None
        back_by = clock(restart.expected_back_by or timezone.now(), settings.TIME_ZONE,
                        round_up=True)
        self.say(f"Act 3 — a planned restart of gemma, now (Restarts page): expected outage "
                 f"{restart.expected_drain_seconds} s drain + {restart.expected_startup_seconds} "
                 f"s start-up, back by {back_by} ({settings.TIME_ZONE}). The node's worker runs "
                 "the runbook: pre-check, drain, stop, drop the page cache, re-check, start, "
                 "follow the start-up.")
        reported: set[int] = set()

        def finished() -> bool:
            for step in restart.steps.filter(finished_at__isnull=False).exclude(pk__in=reported):
                reported.add(step.pk)
                mark = "ok" if step.ok else ("failed" if step.ok is False else "done")
                self.say(f"  restart step {step.step}: {mark} — {step.message}")
            restart.refresh_from_db()
            return restart.status not in (Restart.Status.SCHEDULED, Restart.Status.RUNNING)

        if self.until(finished, RESTART_SECONDS):
            measured = (f"; measured start-up {restart.startup_seconds:.0f} s"
                        if restart.startup_seconds else "")
            self.say(f"Restart {restart.status}: {restart.outcome.rstrip('.')}{measured}.")
        else:
            self.say(f"The restart is still {restart.status} after {RESTART_SECONDS / 60:.0f} "
                     "min; follow it on the Restarts page.")
        self.rest_of(started, AFTER_RESTART_SECONDS)
        return restart

    def tell(self, acts: Iterable[str]) -> None:
        """Launch the engines, wait for SparkOps to see them, and play ``acts`` in order.

        Every rule setting the story changes is put back as it was when the story ends or is
        interrupted (:func:`settings_restored`); the demo's fresh-start record (see
        :func:`record_fresh_start`) is closed once SparkOps has seen the new containers, so
        the squeeze act's recreation counts as the unplanned restart it is.
        """
        chosen = [act for act in ACTS if act in set(acts)]
        with settings_restored(self.say):
            try:
                self.launch()
                self.wait_for_engines()
            finally:
                close_fresh_start(self.node_id, timezone.now())
            self.act_steady()
            for act in chosen:
                if act == "squeeze":
                    self.clear_of_start()
                    self.calibrate_squeeze()
                    self.act_squeeze()
                elif act == "document":
                    self.act_document()
                elif act == "restart":
                    self.act_restart()


@contextmanager
def settings_restored(say: Callable[[str], None]) -> Iterator[None]:
    """Put the story's rule settings back as they were on entry, however the block ends.

    The calibrated margin fits one moment of one machine: left in place it would keep firing on
    noise. A row the story created is deleted; a changed one gets its fields back.
    """
    before = {row["rule"]: row for row in RuleSetting.objects.filter(rule=SQUEEZE_RULE)
              .values("rule", *[f"{name}_id" if name == "updated_by" else name
                                for name in RESTORED_FIELDS])}
    try:
        yield
    finally:
        restore_rule_settings(before)
        say("The prefill-squeeze rule's settings are back as they were before the story.")


def restore_rule_settings(before: dict[str, dict[str, Any]]) -> None:
    """Make the story's rule settings what ``before`` (``values()`` rows by rule) holds."""
    for rule in (SQUEEZE_RULE,):
        row = before.get(rule)
        if row is None:
            RuleSetting.objects.filter(rule=rule).delete()
        else:
            RuleSetting.objects.filter(rule=rule).update(
                **{key: value for key, value in row.items() if key != "rule"})


def record_fresh_start(node: Node, began: datetime) -> list[Restart]:
    """Record the demo's own recreation of its engines as planned, before SparkOps collects.

    A re-run removes the previous run's containers and starts new ones of the same names: to
    the collectors that is an engine gone and restarted behind their back. A planned restart
    row per engine SparkOps already knows, open from ``began``, explains those events (see
    :mod:`dashboard.restarts.unplanned`); :func:`close_fresh_start` ends it once the new
    containers are seen. A first run knows no engines and records nothing.
    """
    engines = Engine.objects.filter(node=node, name__in=[spec.name for spec in ENGINES])
    # Not "running": that status belongs to the runbook, whose watchdog would mark a row
    # without heartbeats interrupted, and it would hold the node's one-restart-at-a-time turn.
    return [Restart.objects.create(
        node=node, engine=engine, kind=Restart.Kind.PLANNED, status=Restart.Status.SUCCEEDED,
        requested_at=began, started_at=began, reason=FRESH_START_REASON, worker="demo",
        outcome="The demo recreates this engine's container.") for engine in engines]


def close_fresh_start(node_id: int, now: datetime) -> None:
    """End the open fresh-start records of the node's demo engines (see
    :func:`record_fresh_start`); later events are judged as usual."""
    Restart.objects.filter(node_id=node_id, kind=Restart.Kind.PLANNED, reason=FRESH_START_REASON,
                           finished_at__isnull=True).update(
        finished_at=now, outcome="The demo's fresh container is running.")


def squeeze_room(headroom: int, margin: int, need: int, neighbour_need: int,
                 growth: int) -> tuple[int, int]:
    """``(before, after)``: how far the headroom less the margin stays above gemma's need
    before the growth, and how far it stays from the nearer need after it (bytes)."""
    after = headroom - margin - growth
    return headroom - margin - need, min(need - after, after - neighbour_need)


def noise_verdict(spread: int, samples: int, before_room: int, after_room: int, *,
                  within_budget: bool = False) -> str:
    """The act's line on the measured noise against the calibrated room: MemAvailable's (what
    every program on the machine moves), or the memory budget's room (only the engines' own
    prefill buffers move it)."""
    moved = ("The room in the engines' memory budget moved by", "the engines' own prefill "
             "buffers") if within_budget else ("MemAvailable moved by", "the machine's own noise")
    measured = (f"{moved[0]} {_gib(spread)} across {samples} collections ({moved[1]}); the "
                f"headroom keeps {_gib(before_room)} of room before the growth and "
                f"{_gib(after_room)} after it")
    if after_room >= NOISE_SPREADS * spread and before_room >= NOISE_SPREADS * spread:
        return f"{measured}: at least {NOISE_SPREADS} times the noise on both sides."
    movers = "the engines' own prefills" if within_budget else "other programs"
    return (f"{measured}: less than {NOISE_SPREADS} times the noise, so {movers} may hide the "
            "squeeze or fire it early; a larger --mib-per-gib gives more room.")


def squeeze_margin(headroom: int, need: int, neighbour_need: int,
                   growth: int) -> tuple[int, int]:
    """``(margin, hysteresis)`` in bytes for the prefill-squeeze rule on this machine.

    The rule fires for an engine when headroom − margin < its prefill need. Before the growth
    ``headroom − margin`` must clear the need of the engine at risk; after it (``growth`` less)
    it must fall below that need but still clear the neighbour's own, smaller need, as on the
    GB10. The margin puts ``headroom − margin − growth`` halfway between the two needs, so
    either side has the same room against the machine's own noise. The hysteresis is a quarter
    of the growth: the alert resolves only once the neighbour really shrank back.
    """
    room = min(max(need - neighbour_need, 0), growth)
    # Without room between the two needs both are squeezed; then half the growth either side.
    gap = growth - room / 2 if room > 0 else growth / 2
    return max(int(headroom - need - gap), 0), growth // 4


def reset_squeeze_calibration() -> None:
    """Drop a previous demo's calibration: it was fitted to that run's free memory."""
    setting = RuleSetting.objects.filter(rule=SQUEEZE_RULE).first()
    if setting and setting.thresholds:
        setting.thresholds = {k: v for k, v in setting.thresholds.items()
                              if k not in ("margin_gib", "hysteresis_gib", "lookback_minutes")}
        setting.save(update_fields=["thresholds"])
