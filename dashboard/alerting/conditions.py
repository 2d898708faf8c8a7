"""What the rules hand to the alert lifecycle: one evaluated condition per (rule, node, engine).

Rules (``dashboard.alerting.rules``) compute a value and its thresholds; the lifecycle
(``dashboard.alerting.lifecycle``) decides from them whether an alert is pending, firing or
resolved, applying hysteresis: an alert fires when the value crosses ``threshold`` and clears only
when it comes back past ``clear``, so a value hovering at the threshold does not flap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Direction = Literal["below", "above"]
Severity = Literal["critical", "warning", "info"]


@dataclass(frozen=True)
class Condition:
    """One rule evaluated for one node (and engine, for per-engine rules).

    ``value`` None means the rule could not be evaluated now (a figure is unknown): the alert
    keeps its state, it neither fires nor resolves on missing data. ``direction`` "below" means
    "bad when value < threshold" (headroom); "above" means "bad when value > threshold".
    ``clear`` is the hysteresis edge (>= threshold for "below", <= threshold for "above").
    ``summary`` is one line for people; ``details`` holds the numbers and the cause, JSON-ready.
    ``settled`` (a predicting rule's) ends the question the alert asked: see the field.
    """

    rule: str
    node_id: int
    engine_id: int | None
    value: float | None
    threshold: float
    clear: float
    direction: Direction
    severity: Severity
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    # A prediction met its outcome (the engine it was about is ready, failed or gone): the
    # scope's open alert resolves with these words whatever the value; none is opened.
    settled: str | None = None

    @property
    def scope(self) -> str:
        """A stable key for "one open alert per (rule, node, engine)"."""
        return f"{self.rule}:{self.node_id}:{self.engine_id or '-'}"

    def crosses_threshold(self) -> bool | None:
        if self.value is None:
            return None
        return self.value < self.threshold if self.direction == "below" \
            else self.value > self.threshold

    def back_past_clear(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.clear if self.direction == "below" else self.value <= self.clear
