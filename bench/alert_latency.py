"""Benchmark 3: from a neighbour taking the room to the webhook, SparkOps next to Prometheus.

One trial:

1. **Calibrate** on MemAvailable as the monitors see it now (the machine's, or the isolated
   view of ``bench.meminfo_view``): threshold T = MemAvailable − A/2, where A is the
   neighbour's allocation. SparkOps' ``prefill-squeeze`` margin is set to T − (engine 1's
   prefill need), so it fires exactly when MemAvailable falls below T; each Prometheus gets the
   rule ``node_memory_MemAvailable_bytes < T`` with ``for`` equal to SparkOps' default (10 s)
   and a ``trial`` label, and is reloaded. Nothing else is changed from the defaults.
2. Wait a random part of the slowest cycle in play (5 s, or 60 s when the default-timing
   servers are waited for), so the allocation lands at a random phase of every cycle.
3. **Allocate**: a plain process maps A bytes and touches every page. t0 is the moment
   MemAvailable falls below T (read every 5 ms while it allocates; touching gigabytes takes
   seconds, and the threshold is crossed halfway).
4. Wait for each stack's first firing webhook of this trial at the loopback receiver; latency
   is its arrival − t0. The payloads also say when the alert fired (and, for SparkOps, when
   it first saw the condition). An answer counts only if MemAvailable stayed below T until it
   arrived and the stack did not fire on something earlier; otherwise the trial is repeated.
5. Release the memory and set SparkOps' margin back so its alert resolves; the next trial
   waits until every Prometheus has scraped a sample taken after the release (so no stale low
   value starts it).

Every trial is timed on SparkOps and on the Prometheus that scrapes at SparkOps' interval; the
first ``alert_default_trials`` also wait for the Prometheus servers at documented default
timings (about 1.5–3.5 minutes each), which is why those run as several independent servers.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime

from bench.meminfo_view import MeminfoView, real_mem_available
from bench.promstack import HEADROOM_ALERT, Prometheus
from bench.stats import summarize
from sparkops.testing.ports import wait_for
from sparkops.testing.webhooks import Received, WebhookReceiver

GIB = 1024**3
RULE = "prefill-squeeze"
SPARKOPS_PATH, PROM_5S_PATH, PROM_DEFAULT_PATH = "/sparkops", "/prom-5s", "/prom-default"
SHORT_TIMEOUT_S, LONG_TIMEOUT_S = 150.0, 330.0
DEFAULT_CYCLE_S = 60.0  # Prometheus' default scrape and evaluation interval

# The neighbour: maps ``size`` bytes, writes every page, says "ready", holds until stdin closes.
NEIGHBOUR = """
import mmap, sys
size = int(sys.argv[1])
room = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
chunk = b"\\x01" * (16 << 20)
for offset in range(0, size, len(chunk)):
    room[offset:offset + len(chunk)] = chunk[:size - offset]
print("ready", flush=True)
sys.stdin.read()
"""


def _seconds(iso: str | None) -> float | None:
    if not iso:
        return None
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


@dataclass
class StackTiming:
    """One stack's answer to one allocation (seconds after t0; None: no webhook in time)."""

    latency: float | None = None
    detected: float | None = None  # SparkOps only: it first saw the condition (pending)
    fired: float | None = None  # pending → firing


@dataclass
class Trial:
    index: int
    waits_default: bool
    threshold_bytes: int
    prefill_need_bytes: int
    allocation_seconds: float = 0.0
    sparkops: StackTiming = field(default_factory=StackTiming)
    prom_5s: StackTiming = field(default_factory=StackTiming)
    prom_default: list[StackTiming] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Neighbour:
    """A plain process that takes ``size`` bytes of real memory until released.

    Touching gigabytes takes seconds (page faults), so the moment that counts is measured, not
    assumed: while it allocates, MemAvailable is read every 5 ms and ``crossed_at`` is when it
    first fell below ``threshold`` (None if it never did).
    """

    def __init__(self, size: int, threshold: int, memory: Memory) -> None:
        started = time.monotonic()
        self.crossed_at: float | None = None
        self.memory = memory
        self.process = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(size)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        memory.neighbour_started(self.process.pid)
        ready = threading.Event()
        threading.Thread(target=self._wait_ready, args=(ready,), daemon=True).start()
        while not ready.is_set() and self.process.poll() is None:
            if self.crossed_at is None and memory.available() < threshold:
                self.crossed_at = time.time()
            time.sleep(0.005)
        if not ready.is_set():
            self.release()
            raise RuntimeError("the neighbour could not allocate its memory")
        time.sleep(0.05)  # the isolated view's next rewrite
        if self.crossed_at is None and memory.available() < threshold:
            self.crossed_at = time.time()
        self.allocation_seconds = time.monotonic() - started

    def _wait_ready(self, ready: threading.Event) -> None:
        if self.process.stdout and self.process.stdout.readline().strip() == "ready":
            ready.set()

    def release(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.memory.neighbour_started(None)


class Memory:
    """MemAvailable as the monitors see it: the real one, or the isolated view's."""

    def __init__(self, view: MeminfoView | None) -> None:
        self.view = view

    @property
    def mode(self) -> str:
        return "real" if self.view is None else "isolated"

    def available(self) -> int:
        return real_mem_available() if self.view is None else self.view.mem_available()

    def neighbour_started(self, pid: int | None) -> None:
        if self.view is not None:
            self.view.neighbour_pid = pid


class SparkOpsSide:
    """What a trial reads and sets in SparkOps' database (Django is set up by the caller)."""

    def __init__(self, node_name: str, engine_name: str) -> None:
        self.node_name, self.engine_name = node_name, engine_name

    def add_webhook(self, url: str) -> None:
        from dashboard.notify.models import Channel

        Channel.objects.create(name="benchmark receiver", kind="webhook", config={"url": url})

    def ready(self) -> bool:
        """Has SparkOps built a ledger with engine 1's prefill need yet?"""
        return self.prefill_need() is not None

    def prefill_need(self) -> int | None:
        from collectors.models import Node

        node = Node.objects.filter(name=self.node_name).first()
        for share in ((node.ledger or {}).get("engines", []) if node else []):
            if share.get("name") == self.engine_name:
                return share.get("prefill_need")
        return None

    def set_threshold(self, threshold_bytes: int, need_bytes: int) -> None:
        """Fire when headroom < ``threshold_bytes``: margin = threshold − need (the rule
        compares headroom − margin with the need). Timings and hysteresis stay the defaults."""
        from dashboard.alerting.models import RuleSetting

        margin_gib = round((threshold_bytes - need_bytes) / GIB, 4)
        RuleSetting.objects.update_or_create(rule=RULE,
                                             defaults={"thresholds": {"margin_gib": margin_gib}})

    def alert_open(self) -> bool:
        from dashboard.alerting.models import Alert

        return Alert.objects.filter(rule=RULE, node__name=self.node_name,
                                    state__in=["pending", "firing"]).exists()


class MemoryWatch(threading.Thread):
    """After t0, reads MemAvailable every 50 ms and remembers when it first rose back to the
    threshold or above: on a shared machine other work can hand memory back mid-trial, and a
    stack's answer counts only if the condition held until its webhook arrived."""

    def __init__(self, threshold: int, memory: Memory) -> None:
        super().__init__(daemon=True)
        self.threshold = threshold
        self.memory = memory
        self.rose_at: float | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(0.05):
            if self.rose_at is None and self.memory.available() >= self.threshold:
                self.rose_at = time.time()

    def held_until(self, moment: float) -> bool:
        return self.rose_at is None or self.rose_at > moment

    def stop(self) -> None:
        self._stop.set()


class AlertLatencyBench:
    """Runs the trials against SparkOps and the Prometheus servers of the live phase."""

    def __init__(self, *, receiver: WebhookReceiver, sparkops: SparkOpsSide,
                 prom_5s: Prometheus, prom_default: list[Prometheus], allocation_bytes: int,
                 interval: float, wait_prometheus: bool, budget_s: float,
                 memory: Memory) -> None:
        self.receiver = receiver
        self.memory = memory
        self.sparkops = sparkops
        self.prom_5s = prom_5s
        self.prom_default = prom_default
        self.allocation_bytes = allocation_bytes
        self.interval = interval
        self.wait_prometheus = wait_prometheus
        self.budget_s = budget_s
        self.trials: list[Trial] = []
        self.stopped = ""  # why the trials ended early, if they did
        self._released_at = 0.0

    def run(self, count: int, default_trials: int) -> list[Trial]:
        """Trials until ``count`` gave SparkOps a valid answer and ``default_trials`` gave the
        default-timing servers theirs (a trial disturbed by other work on the machine is
        repeated), within twice as many attempts and the time budget."""
        deadline = time.monotonic() + self.budget_s
        sparkops_done = defaults_done = 0
        index = 0
        while ((sparkops_done < count or defaults_done < default_trials)
               and index < 2 * count + 2 and time.monotonic() < deadline):
            index += 1
            waits_default = bool(self.prom_default) and defaults_done < default_trials
            try:
                trial = self.run_trial(index, waits_default=waits_default)
            except (TimeoutError, RuntimeError) as error:
                self.stopped = f"trial {index} could not run: {error}"
                print(f"  alert trials stopped: {self.stopped}", flush=True)
                break
            self.trials.append(trial)
            sparkops_done += trial.sparkops.latency is not None
            defaults_done += waits_default and any(t.latency is not None
                                                   for t in trial.prom_default)
            print(f"  alert trial {index}: SparkOps {_fmt(trial.sparkops.latency)}, "
                  f"Prometheus 5 s {_fmt(trial.prom_5s.latency)}, Prometheus defaults "
                  f"{', '.join(_fmt(t.latency) for t in trial.prom_default) or '-'}"
                  f"{'; ' + '; '.join(trial.notes) if trial.notes else ''}", flush=True)
        return self.trials

    def _servers(self, waits_default: bool) -> list[Prometheus]:
        return [self.prom_5s, *(self.prom_default if waits_default else [])]

    def run_trial(self, index: int, *, waits_default: bool) -> Trial:
        # Room for the neighbour first: this machine has no swap and may be shared.
        wait_for(lambda: real_mem_available() > self.allocation_bytes + 3 * GIB, 120,
                 "enough free memory for the neighbour", period=0.5)
        wait_for(lambda: not self.sparkops.alert_open(), 120, "SparkOps' alert resolved",
                 period=0.5)
        for server in self._servers(waits_default):
            wait_for(lambda s=server: (s.latest_sample_time() or 0) > self._released_at, 90,
                     f"{server.name} scraped after the last release", period=0.5)
        # Calibrate last, just before the allocation, so the threshold is 2 GiB below what
        # MemAvailable is when the neighbour starts.
        need = self.sparkops.prefill_need() or 0
        threshold = self.memory.available() - self.allocation_bytes // 2
        trial = Trial(index, waits_default, threshold, need)
        self.sparkops.set_threshold(threshold, need)
        for server in [self.prom_5s, *self.prom_default]:
            server.write_rules(threshold, index)
            server.reload(index)
        # A random phase of the slowest cycle waited for (the default servers scrape and
        # evaluate once a minute): the waits above leave each trial just after a scrape.
        time.sleep(random.uniform(0, DEFAULT_CYCLE_S if waits_default else self.interval))

        neighbour = Neighbour(self.allocation_bytes, threshold, self.memory)
        trial.allocation_seconds = round(neighbour.allocation_seconds, 3)
        try:
            if neighbour.crossed_at is None:
                trial.notes.append("MemAvailable never fell below the threshold (not counted)")
            else:
                watch = MemoryWatch(threshold, self.memory)
                watch.start()
                try:
                    self._collect(trial, neighbour.crossed_at, waits_default, watch)
                finally:
                    watch.stop()
        finally:
            neighbour.release()
            self._released_at = time.time()
            # Back to a margin nothing crosses, so SparkOps' alert resolves before the next.
            self.sparkops.set_threshold(need, need)
        return trial

    def _collect(self, trial: Trial, t0: float, waits_default: bool,
                 watch: MemoryWatch) -> None:
        deadline = time.monotonic() + (LONG_TIMEOUT_S if waits_default else SHORT_TIMEOUT_S)
        found = self.receiver.wait_for(lambda d: _sparkops_match(d, t0),
                                       deadline - time.monotonic())
        if found is None:
            trial.notes.append("no SparkOps webhook in time")
        else:
            alert = found.payload["alert"]
            started = _seconds(alert.get("started_at"))
            fired = _seconds(alert.get("fired_at"))
            timing = StackTiming(latency=found.arrived - t0,
                                 detected=None if started is None else started - t0,
                                 fired=None if fired is None else fired - t0)
            trial.sparkops = self._valid("SparkOps", timing, found.arrived, trial, watch)
        if not self.wait_prometheus:
            return
        trial.prom_5s = self._prometheus(PROM_5S_PATH, self.prom_5s.name, trial, t0, deadline,
                                         watch)
        if waits_default:
            trial.prom_default = [self._prometheus(PROM_DEFAULT_PATH, server.name, trial, t0,
                                                   deadline, watch)
                                  for server in self.prom_default]

    @staticmethod
    def _valid(stack: str, timing: StackTiming, arrived: float, trial: Trial,
               watch: MemoryWatch) -> StackTiming:
        """The timing, or an empty one (with a note) when the trial was not clean for it."""
        if timing.detected is not None and timing.detected < 0:
            trial.notes.append(f"{stack} saw the condition before the allocation (not counted)")
            return StackTiming()
        if not watch.held_until(arrived):
            trial.notes.append(f"MemAvailable rose above the threshold before {stack}'s webhook "
                               "(other work on the machine; not counted)")
            return StackTiming()
        return timing

    def _prometheus(self, path: str, stack: str, trial: Trial, t0: float,
                    deadline: float, watch: MemoryWatch) -> StackTiming:
        found = self.receiver.wait_for(lambda d: _am_match(d, path, stack, trial.index),
                                       max(deadline - time.monotonic(), 0))
        if found is None:
            trial.notes.append(f"no webhook from {stack} in time")
            return StackTiming()
        # Prometheus sends an alert's firing time as its startsAt (not when it went pending).
        alert = _am_alert(found, stack, trial.index) or {}
        fired = _seconds(alert.get("startsAt"))
        timing = StackTiming(latency=found.arrived - t0,
                             fired=None if fired is None else fired - t0)
        if timing.fired is not None and timing.fired < 0:
            trial.notes.append(f"{stack} fired before the allocation (not counted)")
            return StackTiming()
        return self._valid(stack, timing, found.arrived, trial, watch)


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"



def _sparkops_match(delivery: Received, t0: float) -> bool:
    body = delivery.payload
    return (delivery.path == SPARKOPS_PATH and delivery.arrived >= t0
            and body.get("type") == "alert.firing"
            and (body.get("alert") or {}).get("rule") == RULE)


def _am_alert(delivery: Received, stack: str, trial: int) -> dict | None:
    for alert in delivery.payload.get("alerts") or []:
        labels = alert.get("labels") or {}
        if (alert.get("status") == "firing" and labels.get("alertname") == HEADROOM_ALERT
                and labels.get("stack") == stack and labels.get("trial") == str(trial)):
            return alert
    return None


def _am_match(delivery: Received, path: str, stack: str, trial: int) -> bool:
    return delivery.path == path and _am_alert(delivery, stack, trial) is not None


def summarize_trials(trials: list[Trial], stopped: str = "") -> dict:
    """Per stack: latency, and when the condition was first seen, as summaries (seconds);
    ``missing``: trials that gave this stack no valid answer (the notes say why)."""

    def figures(timings: list[StackTiming]) -> dict:
        return {
            "latency": _dict(summarize(t.latency for t in timings if t.latency is not None)),
            "detected": _dict(summarize(t.detected for t in timings if t.detected is not None)),
            "fired": _dict(summarize(t.fired for t in timings if t.fired is not None)),
            "missing": sum(1 for t in timings if t.latency is None),
        }

    return {
        "sparkops": figures([t.sparkops for t in trials]),
        "prom_5s": figures([t.prom_5s for t in trials]),
        "prom_default": figures([timing for t in trials if t.waits_default
                                 for timing in t.prom_default]),
        "trials": [asdict(t) for t in trials],
        "stopped": stopped,
    }


def _dict(summary) -> dict | None:
    return summary.as_dict() if summary else None
