"""What every alert rule is made of: its documentation, its tunable numbers, its evaluation.

A rule is a plain function over stored state (the node's ledger written after each collection,
engine rows and samples, ledger changes) that returns one
:class:`~dashboard.alerting.conditions.Condition` per scope it watches; the lifecycle decides
what fires. The defaults declared here are what the rule settings page shows and what admins
override (``dashboard.alerting.settings`` merges the two).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from collectors.kinds.registry import reader_for
from collectors.models import Engine, Node
from dashboard.alerting.conditions import Condition

ValueUnit = Literal["GiB", "s", "fraction", "down", "restarts"]

# Alertmanager's default repeat_interval: a still-firing alert is notified again every 4 h.
DEFAULT_REPEAT_SECONDS = 4 * 3600

Evaluate = Callable[[Node, dict, list[Engine], dict[str, Any], datetime], list[Condition]]
"""``evaluate(node, ledger, engines, thresholds, now)``: the rule's conditions for ``node``.

``ledger`` is ``node.ledger`` (an empty dict when none was written), ``engines`` the node's
present engines, ``thresholds`` the values in force keyed by :attr:`ThresholdSpec.key`.
"""


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
class Rule:
    """An alert rule: what it watches, the defaults an admin may override, and its evaluation.

    ``for_seconds`` is how long its condition must stay active before a pending alert fires
    (Prometheus' ``for``); ``repeat_seconds`` how often a still-firing alert is notified again
    (Alertmanager's ``repeat_interval``). ``value_unit`` says what its value counts, so pages
    and notices write it in words: "GiB", "s", "fraction" (of a usual rate), "down" (1 when
    down, 0 when up) or "restarts" (a count).
    """

    name: str
    title: str
    description: str
    for_seconds: int
    evaluate: Evaluate
    repeat_seconds: int = DEFAULT_REPEAT_SECONDS
    thresholds: tuple[ThresholdSpec, ...] = ()
    value_unit: ValueUnit = "GiB"

    def threshold_spec(self, key: str) -> ThresholdSpec:
        """The spec of threshold ``key``; KeyError when the rule has none by that name."""
        for spec in self.thresholds:
            if spec.key == key:
                return spec
        raise KeyError(f"rule {self.name!r} has no threshold {key!r}")


def unknown_reason(engine: Engine, part: str) -> str | None:
    """Why ``engine`` reports no ``part`` (``"rates"``, ``"requests"``, ``"kv_usage"``, …), in
    its kind's words: what its last read said it could not report, else what its kind never
    reports (``collectors.kinds``); None when the part is not known to be missing. A rule that
    reads such a part gives an unknown value (None) with this reason, never a 0. Cost: none."""
    said = ((engine.metrics or {}).get("unknown") or {}).get(part)
    return said or reader_for(engine.kind).never_reported.get(part)


def endpoints_label(engine: Engine) -> str:
    """What ``engine``'s kind is read from, as a failed read names it: "/metrics" (vLLM),
    "llama-server API", "Ollama API"."""
    return reader_for(engine.kind).endpoints
