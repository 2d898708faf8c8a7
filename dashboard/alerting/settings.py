"""Alert rule settings: each rule's defaults with the admins' overrides merged on top.

This is the alerting package's own settings module, not Django's. The defaults are declared
with each rule (``dashboard.alerting.rules``): ``for_seconds``, ``repeat_seconds`` and the
thresholds, each with a unit, a range and a default. Admins override any of these on the rule
settings page; the overrides are stored in :class:`~dashboard.alerting.models.RuleSetting` (only
the values that differ from the defaults are meaningful: a missing key means "use the
default"). :func:`rule_settings` merges the two.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from dashboard.alerting.models import RuleSetting
from dashboard.alerting.rules import RULES, Rule, ThresholdSpec
from sparkops.prepared import PreparedRead
from sparkops.units import GIB

log = logging.getLogger(__name__)

# Limits of the two timings. A repeat shorter than a minute is a notification storm, not a
# reminder; a "for" longer than a day means the rule should be disabled instead.
FOR_SECONDS_MAX = 86_400
REPEAT_SECONDS_MIN = 60
REPEAT_SECONDS_MAX = 7 * 86_400


class UnknownRule(KeyError):
    """The rule name is not one of :data:`RULES` (rules are defined in code, not in the DB)."""


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
    defaults: Rule
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


def duration_text(seconds: int) -> str:
    """Seconds for people: "45 s", "10 min", "4 h", "1 h 30 min"."""
    if seconds < 60 or seconds % 60:
        return f"{seconds} s"
    hours, minutes = divmod(seconds // 60, 60)
    parts = ([f"{hours} h"] if hours else []) + ([f"{minutes} min"] if minutes else [])
    return " ".join(parts)


def rule_defaults(rule: str) -> Rule:
    """The rule named ``rule``, with its documented defaults. Raises :class:`UnknownRule`."""
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


def merge(defaults: Rule, stored: RuleSetting | None) -> EffectiveSetting:
    """Apply a stored override row to a rule's defaults.

    A stored value that fails validation (possible only if the row was written around the form)
    is ignored with a warning: a bad override must not silence or break a rule.
    """
    thresholds = {spec.key: spec.default for spec in defaults.thresholds}
    if stored is None:
        return EffectiveSetting(defaults.name, True, defaults.for_seconds, defaults.repeat_seconds,
                                thresholds, defaults)
    overridden: set[str] = set()
    timings = {"for_seconds": defaults.for_seconds, "repeat_seconds": defaults.repeat_seconds}
    for name in timings:
        value = getattr(stored, name)
        if value is None:
            continue
        problem = timing_problem(name, value)
        if problem:
            log.warning("ignoring stored %s of rule %s: %s", name, defaults.name, problem)
            continue
        timings[name] = value
        overridden.add(name)
    for key, value in (stored.thresholds or {}).items():
        problem = _stored_threshold_problem(defaults, key, value)
        if problem:
            log.warning("ignoring stored threshold %s of rule %s: %s", key, defaults.name, problem)
            continue
        thresholds[key] = float(value)
        overridden.add(key)
    if not stored.enabled:
        overridden.add("enabled")
    return EffectiveSetting(defaults.name, stored.enabled, timings["for_seconds"],
                            timings["repeat_seconds"], thresholds, defaults, frozenset(overridden))


def _stored_threshold_problem(defaults: Rule, key: str, value: Any) -> str | None:
    try:
        spec = defaults.threshold_spec(key)
    except KeyError:
        return "no such threshold"
    return spec.problem(value)


def rule_settings(rule: str) -> EffectiveSetting:
    """The settings in force for ``rule`` (one query; none within :func:`read_once`). Raises
    :class:`UnknownRule`."""
    defaults = rule_defaults(rule)
    held = _held.get()
    if held is not None:
        return held[rule]
    return merge(defaults, RuleSetting.objects.filter(rule=rule).first())


def all_rule_settings() -> dict[str, EffectiveSetting]:
    """The settings in force for every rule, in documentation order (one query; none within
    :func:`read_once`)."""
    held = _held.get()
    if held is not None:
        return dict(held)
    stored = {row.rule: row for row in _STORED_SETTINGS(list(RULES))}
    return {rule: merge(defaults, stored.get(rule)) for rule, defaults in RULES.items()}


# The stored settings of the rules named (a prepared read: every alert round reads them).
_STORED_SETTINGS = PreparedRead(lambda rules: RuleSetting.objects.filter(rule__in=rules))


# The settings read for one evaluation round (:func:`read_once`).
_held: ContextVar[dict[str, EffectiveSetting] | None] = ContextVar("rule_settings_held",
                                                                   default=None)


@contextmanager
def read_once() -> Iterator[None]:
    """Within it every question about the settings in force is answered from one read: an
    evaluation round's rules (including one that reads another rule's threshold) and its alert
    lifecycle judge by the same values, for one query. Nested, the outer read holds."""
    if _held.get() is not None:
        yield
        return
    token = _held.set(all_rule_settings())
    try:
        yield
    finally:
        _held.reset(token)



def prefill_margin_bytes() -> int:
    """The prefill-squeeze alert's margin in force on this installation, in bytes: what the fit
    planner and the predicted-squeeze alert judge a prefill by (``collectors.fitplan``)."""
    return int(rule_settings("prefill-squeeze").thresholds["margin_gib"] * GIB)
