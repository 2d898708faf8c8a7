"""Alert rule settings: the documented defaults of each rule, and admins' overrides merged on top.

This is the alerting package's own settings module, not Django's. Each rule has

* ``for_seconds``: how long its condition must stay active before a pending alert fires
  (Prometheus' ``for``);
* ``repeat_seconds``: how often a still-firing alert is notified again (Alertmanager's
  ``repeat_interval``; 4 h by default, as there);
* thresholds: the numbers the rule compares against, each with a unit, a range and a default.

Admins override any of these on the rule settings page; the overrides are stored in
:class:`~dashboard.alerting.models.RuleSetting` (only the values that differ from the defaults
are meaningful: a missing key means "use the default"). :func:`rule_settings` merges the two.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from dashboard.alerting.models import RuleSetting

log = logging.getLogger(__name__)

GIB = 1024**3
DEFAULT_REPEAT_SECONDS = 4 * 3600
# Limits of the two timings. A repeat shorter than a minute is a notification storm, not a
# reminder; a "for" longer than a day means the rule should be disabled instead.
FOR_SECONDS_MAX = 86_400
REPEAT_SECONDS_MIN = 60
REPEAT_SECONDS_MAX = 7 * 86_400


class UnknownRule(KeyError):
    """The rule name is not one of :data:`RULES` (rules are defined in code, not in the DB)."""


@dataclass(frozen=True)
class ThresholdSpec:
    """One tunable number of a rule: its key in ``thresholds``, default, unit and valid range."""

    key: str
    label: str
    default: float
    unit: str
    help: str
    minimum: float = 0.0
    maximum: float = 1_000_000.0

    @property
    def default_text(self) -> str:
        return f"{self.default:g}"

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not acceptable for this threshold, or None when it is."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{self.label} must be a number."
        if not math.isfinite(value):
            return f"{self.label} must be a finite number."
        if value < self.minimum:
            return f"{self.label} must be at least {self.minimum:g} {self.unit}."
        if value > self.maximum:
            return f"{self.label} must be at most {self.maximum:g} {self.unit}."
        return None


@dataclass(frozen=True)
class RuleDefaults:
    """A rule as documented: what it watches, and the defaults an admin may override."""

    rule: str
    title: str
    description: str
    for_seconds: int
    repeat_seconds: int = DEFAULT_REPEAT_SECONDS
    thresholds: tuple[ThresholdSpec, ...] = ()

    def threshold_spec(self, key: str) -> ThresholdSpec:
        for spec in self.thresholds:
            if spec.key == key:
                return spec
        raise KeyError(f"rule {self.rule!r} has no threshold {key!r}")


@dataclass(frozen=True)
class EffectiveSetting:
    """A rule's settings in force: the defaults with valid admin overrides applied.

    ``overridden`` names what differs from the defaults ("for_seconds", "repeat_seconds",
    "enabled" or a threshold key), so pages can show which values an admin changed.
    """

    rule: str
    enabled: bool
    for_seconds: int
    repeat_seconds: int
    thresholds: dict[str, float]
    defaults: RuleDefaults
    overridden: frozenset[str] = field(default_factory=frozenset)

    def threshold(self, key: str) -> float:
        return self.thresholds[key]

    @property
    def for_text(self) -> str:
        return duration_text(self.for_seconds)

    @property
    def repeat_text(self) -> str:
        return duration_text(self.repeat_seconds)

    @property
    def threshold_rows(self) -> list[tuple[ThresholdSpec, str, bool]]:
        """(spec, value in force as text, overridden?) per threshold, in documentation order."""
        return [(spec, f"{self.thresholds[spec.key]:g}", spec.key in self.overridden)
                for spec in self.defaults.thresholds]


RULES: dict[str, RuleDefaults] = {
    spec.rule: spec
    for spec in (
        RuleDefaults(
            rule="prefill-squeeze",
            title="Prefill squeeze",
            description=(
                "An engine's next prefill would not fit: MemAvailable minus the transient buffer "
                "a prefill grabs (as wide as --max-num-batched-tokens) is below the margin. The "
                "idle neighbour's prefill and concurrency slow down first, decode does not."
            ),
            for_seconds=10,
            thresholds=(
                ThresholdSpec("margin_gib", "Margin", 2.0, "GiB",
                              "Room that must remain after a prefill buffer is allocated.",
                              maximum=1024.0),
                ThresholdSpec("hysteresis_gib", "Hysteresis", 0.5, "GiB",
                              "A firing alert resolves only once headroom is back this far "
                              "above the need, so a value hovering at the edge does not flap.",
                              maximum=1024.0),
                ThresholdSpec("lookback_minutes", "Cause look-back", 30.0, "min",
                              "How far back a ledger change (a neighbour's bigger KV pool, page "
                              "cache growth, a process) is named as the cause.",
                              minimum=1.0, maximum=1440.0),
            ),
        ),
        RuleDefaults(
            rule="headroom-floor",
            title="Headroom floor",
            description=(
                "MemAvailable is below the floor, or swap in use is growing. On GB10 running out "
                "wedges the host (NV_ERR_NO_MEMORY) instead of raising a CUDA OOM. The floor is "
                "min(floor_gib, floor_percent of MemTotal): 7.9 GiB on a 121.7 GiB GB10, 8 GiB "
                "from 123 GiB up, and less on smaller machines, where 8 GiB would be a large "
                "share of all memory."
            ),
            for_seconds=30,
            thresholds=(
                ThresholdSpec("floor_gib", "Floor", 8.0, "GiB",
                              "Absolute floor for MemAvailable.", maximum=1024.0),
                ThresholdSpec("floor_percent", "Floor on small machines", 6.5, "% of MemTotal",
                              "The floor is the smaller of the absolute floor and this share "
                              "of MemTotal.", maximum=100.0),
                ThresholdSpec("swap_growth_mib_per_min", "Swap growth", 256.0, "MiB/min",
                              "Swap in use growing faster than this also counts as below the "
                              "floor."),
                ThresholdSpec("hysteresis_gib", "Hysteresis", 1.0, "GiB",
                              "A firing alert resolves only once MemAvailable is this far above "
                              "the floor.", maximum=1024.0),
            ),
        ),
        RuleDefaults(
            rule="queue-backlog",
            title="Queue backlog",
            description=(
                "Requests wait in an engine's queue longer than the limit before their first "
                "token: the engine is out of slots (--max-num-seqs) or KV cache."
            ),
            for_seconds=30,
            thresholds=(
                ThresholdSpec("waiting_seconds", "Waiting time", 15.0, "s",
                              "Longest acceptable wait in the queue (the seed's 17th of 20 "
                              "concurrent requests waited 15 s).", maximum=86_400.0),
            ),
        ),
        RuleDefaults(
            rule="prefill-stall",
            title="Prefill stall",
            description=(
                "A long prompt's prefill stalls everyone on the same engine: the other streams' "
                "decode rate collapses below a fraction of its recent rate for a while (vLLM V1 "
                "has no concurrent partial prefill)."
            ),
            for_seconds=0,
            thresholds=(
                ThresholdSpec("decode_collapse_fraction", "Decode collapse", 0.25,
                              "of recent rate",
                              "Decode rate below this fraction of its recent rate counts as "
                              "collapsed.", maximum=1.0),
                ThresholdSpec("min_duration_seconds", "Minimum duration", 10.0, "s",
                              "How long the collapse must last to count as a stall.",
                              maximum=86_400.0),
            ),
        ),
        RuleDefaults(
            rule="engine-down",
            title="Engine down",
            description=(
                "An engine's container is not running or its server does not answer. Engines in "
                "a planned restart are not evaluated by this rule."
            ),
            for_seconds=60,
        ),
        RuleDefaults(
            rule="overcommit",
            title="Overcommit",
            description=(
                "What the engines reserve (weights, KV pools and CUDA graphs when pinned; "
                "--gpu-memory-utilization × MemTotal otherwise) exceeds MemTotal plus the margin. "
                "--kv-cache-memory-bytes skips vLLM's own memory pre-check, so an over-commit "
                "goes straight to OOM."
            ),
            for_seconds=0,
            thresholds=(
                ThresholdSpec("margin_gib", "Margin", 0.0, "GiB",
                              "Room that must remain unreserved.", maximum=1024.0),
                ThresholdSpec("hysteresis_gib", "Hysteresis", 0.5, "GiB",
                              "A firing alert resolves only once reservations are this far "
                              "below the limit.", maximum=1024.0),
            ),
        ),
        RuleDefaults(
            rule="unplanned-restart",
            title="Unplanned restart",
            description=(
                "An engine's container restarted, stopped or vanished without a planned restart "
                "(StartedAt changed, it exited, the OOM killer hit it, or it is gone). Every "
                "restart costs about ten minutes of startup on a GB10."
            ),
            for_seconds=0,
            repeat_seconds=24 * 3600,
            thresholds=(
                ThresholdSpec("recent_minutes", "Remember for", 30.0, "min",
                              "How long after an unplanned restart the alert stays open.",
                              minimum=1.0, maximum=1440.0),
            ),
        ),
        RuleDefaults(
            rule="restart-failed",
            title="Restart failed",
            description=(
                "A planned restart failed, was aborted with the engine left stopped, or was "
                "interrupted (the worker died mid-runbook): the engine may be down."
            ),
            for_seconds=0,
            repeat_seconds=4 * 3600,
            thresholds=(
                ThresholdSpec("recent_minutes", "Remember for", 60.0, "min",
                              "How long after the restart ended the alert stays open.",
                              minimum=1.0, maximum=1440.0),
            ),
        ),
    )
}


def duration_text(seconds: int) -> str:
    """Seconds for people: "45 s", "10 min", "4 h", "1 h 30 min"."""
    if seconds < 60 or seconds % 60:
        return f"{seconds} s"
    hours, minutes = divmod(seconds // 60, 60)
    parts = ([f"{hours} h"] if hours else []) + ([f"{minutes} min"] if minutes else [])
    return " ".join(parts)


def rule_defaults(rule: str) -> RuleDefaults:
    try:
        return RULES[rule]
    except KeyError:
        raise UnknownRule(rule) from None


def timing_problem(name: str, value: Any) -> str | None:
    """Why ``value`` is not acceptable for "for_seconds" or "repeat_seconds", or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "must be a whole number of seconds."
    low, high = (0, FOR_SECONDS_MAX) if name == "for_seconds" \
        else (REPEAT_SECONDS_MIN, REPEAT_SECONDS_MAX)
    if not low <= value <= high:
        return f"must be between {low} and {high} seconds."
    return None


def merge(defaults: RuleDefaults, stored: RuleSetting | None) -> EffectiveSetting:
    """Apply a stored override row to a rule's defaults.

    A stored value that fails validation (possible only if the row was written around the form)
    is ignored with a warning: a bad override must not silence or break a rule.
    """
    thresholds = {spec.key: spec.default for spec in defaults.thresholds}
    if stored is None:
        return EffectiveSetting(defaults.rule, True, defaults.for_seconds, defaults.repeat_seconds,
                                thresholds, defaults)
    overridden: set[str] = set()
    timings = {"for_seconds": defaults.for_seconds, "repeat_seconds": defaults.repeat_seconds}
    for name in timings:
        value = getattr(stored, name)
        if value is None:
            continue
        problem = timing_problem(name, value)
        if problem:
            log.warning("ignoring stored %s of rule %s: %s", name, defaults.rule, problem)
            continue
        timings[name] = value
        overridden.add(name)
    for key, value in (stored.thresholds or {}).items():
        problem = _stored_threshold_problem(defaults, key, value)
        if problem:
            log.warning("ignoring stored threshold %s of rule %s: %s", key, defaults.rule, problem)
            continue
        thresholds[key] = float(value)
        overridden.add(key)
    if not stored.enabled:
        overridden.add("enabled")
    return EffectiveSetting(defaults.rule, stored.enabled, timings["for_seconds"],
                            timings["repeat_seconds"], thresholds, defaults, frozenset(overridden))


def _stored_threshold_problem(defaults: RuleDefaults, key: str, value: Any) -> str | None:
    try:
        spec = defaults.threshold_spec(key)
    except KeyError:
        return "no such threshold"
    return spec.problem(value)


def rule_settings(rule: str) -> EffectiveSetting:
    """The settings in force for ``rule`` (one query). Raises :class:`UnknownRule`."""
    defaults = rule_defaults(rule)
    return merge(defaults, RuleSetting.objects.filter(rule=rule).first())


def all_rule_settings() -> dict[str, EffectiveSetting]:
    """The settings in force for every rule, in documentation order (one query)."""
    stored = {row.rule: row for row in RuleSetting.objects.filter(rule__in=RULES)}
    return {rule: merge(defaults, stored.get(rule)) for rule, defaults in RULES.items()}


def headroom_floor_gib(setting: EffectiveSetting, mem_total_bytes: int | None) -> float:
    """The MemAvailable floor of "headroom-floor" for a machine: min(floor_gib, % of MemTotal).

    With MemTotal unknown the absolute floor applies (never a share of a guessed total).
    """
    floor = setting.threshold("floor_gib")
    if mem_total_bytes is None:
        return floor
    return min(floor, setting.threshold("floor_percent") / 100 * mem_total_bytes / GIB)
