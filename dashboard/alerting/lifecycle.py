"""The alert lifecycle: conditions in, alert state changes and notices out.

Like Prometheus and Alertmanager, an alert for a scope (rule, node, engine) is

* **pending** from the moment its condition crosses the threshold,
* **firing** once the condition has stayed active for the rule's ``for_seconds`` (at once for 0),
* **resolved** when the value comes back past the clear edge, when its scope is no longer
  evaluated (an engine was removed), when its rule is disabled, or, for a rule that predicts,
  when the prediction met its outcome (``Condition.settled``: "settled", with the rule's words).

Between the threshold and the clear edge the alert keeps its state (hysteresis), so a value
hovering at the threshold opens one alert and sends one firing notice, not a storm. A value of
None (unknown) changes nothing: an alert neither fires nor resolves on missing data.

Notices are returned, not sent: the caller turns each :class:`Notice` into outbox rows. Choices:

* A silence mutes notices, not state: a silenced alert still goes pending → firing (the
  AlertEvent says it was silenced) but no firing or repeat notice is issued. When the silence
  ends and the alert is still firing, the next evaluation issues the firing notice that was
  never sent (Alertmanager behaves the same: a muted alert is notified once unmuted).
* A resolved notice is issued only for an alert whose firing was notified (``notify_count >
  0``), and it is issued even while a silence matches: the receiver was told "firing" and must
  not be left believing that for ever; a silence is meant to stop noise, and this ends it.
* A pending alert in the hysteresis band counts towards ``for_seconds``: "active" means "not
  yet back past the clear edge". An unknown value neither advances nor resets it.
* A new incident folded into a firing alert is announced with an "updated" notice. An incident
  is what a rule names as the alert's cause: a restart (``details.restart_id``: a new unplanned
  restart, or a new failed one, of the same engine) or a neighbour that took memory
  (``details.causes[].component``). The notice says what is new (``Notice.news``); a cause that
  the alert already named, at its last evaluation, is not new. Silences mute it like a repeat,
  and it is only issued once the firing notice went out (before that, the firing notice says
  it all).
* The cause an alert fired for (``details["cause"]`` at that evaluation) is recorded once, in
  ``Alert.fired_cause``, and every later notice of it (repeat, updated, resolved) tells that
  cause; the summary ends with it. A different cause named later is ``Alert.cause_now``, told
  as a separate "since then" line, never in its place: receivers were told the first one.
* ``for_seconds`` is judged with half a second of slack (at most a tenth of it). Evaluations
  follow collections, and those do not tick like a clock: each waits up to the broker's polling
  interval (0.25 s) to start and its evaluation as much again. Without slack a 10 s ``for`` at a
  5 s interval would fire at the third evaluation or, by a few milliseconds, the fourth: 5 s
  later, at random. Prometheus, whose evaluations are on an exact grid, has no such jitter.

Delivery is at-least-once when the caller passes ``on_notice``: it is called inside the same
transaction that records the alert's change, so an outbox row written there commits or rolls
back with it. A caller that only uses the returned list has a window (after this module's commit,
before its own) in which a crash loses a notice.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from django.db import IntegrityError, transaction
from django.urls import reverse

from collectors.models import Node
from dashboard.alerting.conditions import Condition
from dashboard.alerting.figures import value_text
from dashboard.alerting.models import (
    OPEN_STATES,
    Alert,
    AlertEvent,
    AlertState,
    ResolveReason,
    Silence,
)
from dashboard.alerting.settings import EffectiveSetting, UnknownRule, all_rule_settings
from sparkops.prepared import PreparedRead

NoticeKind = Literal["firing", "resolved", "repeat", "updated"]

# See the module docstring: evaluation jitter, not a shorter ``for``.
FOR_SLACK_SECONDS = 0.5


@dataclass(frozen=True)
class Notice:
    """Something to tell receivers about ``alert``; the caller turns it into outbox rows.

    ``sequence`` is the alert's ``notify_count`` right after this notice (1 for the first firing
    notice), so ``idempotency_key`` is stable across retries of the same notice and distinct for
    each notice of an alert: receivers use it to drop duplicates of an at-least-once delivery.
    """

    alert: Alert
    kind: NoticeKind
    sequence: int
    news: tuple[str, ...] = ()  # "updated": one line per new incident, for people

    @property
    def idempotency_key(self) -> str:
        return f"sparkops-alert-{self.alert.pk}-{self.sequence}"


NoticeSink = Callable[[Notice], None]


@dataclass(frozen=True)
class OpenAlert:
    """An alert open when a round began: what the round needs of it without its row."""

    pk: int
    rule: str
    scope: str
    started_at: datetime


_OPEN_ALERTS = PreparedRead(lambda node_id: Alert.objects
                            .filter(node_id=node_id, state__in=OPEN_STATES)
                            .values_list("pk", "rule", "scope", "started_at"))


def open_alerts_of(node: Node) -> list[OpenAlert]:
    """The alerts of ``node`` open now (pending or firing). One query (prepared: it runs every
    round)."""
    return [OpenAlert(*row) for row in _OPEN_ALERTS(node.pk)]


def evaluate(
    node: Node,
    conditions: list[Condition],
    now: datetime,
    *,
    evaluated_rules: set[str] | None = None,
    on_notice: NoticeSink | None = None,
    open_alerts: list[OpenAlert] | None = None,
) -> list[Notice]:
    """Apply one evaluation round of ``node``'s rules to its alerts; return the notices due.

    ``conditions`` are this round's evaluated conditions of ``node`` (at most one per scope).
    ``evaluated_rules`` names the rules that ran this round: an open alert of one of those rules
    whose scope has no condition now is resolved as "no longer applies". When None, it is the
    set of rules among ``conditions`` (so a rule that ran and produced no condition at all cannot
    resolve its alerts: pass it explicitly). Open alerts of disabled rules resolve as "rule
    disabled" and conditions of disabled rules are ignored.

    Each alert changes in its own transaction with its row locked, so two evaluators of the same
    node cannot open the same alert twice (the unique constraint on open scopes is the last
    line: a losing insert is retried against the winner's row). ``on_notice`` runs inside that
    transaction (see the module docstring); if it raises, that alert's change is rolled back and
    the exception propagates. ``open_alerts`` are the node's alerts open when the round began
    (:func:`open_alerts_of`), for a caller that read them before its rules ran; read here when
    None.

    Cost: two queries up front (one when ``open_alerts`` is passed), one for the node's
    silences once an alert needs them, then a few per open alert and per condition that
    crosses its threshold; a condition with no open alert that does not cross costs none (its
    scope had no open alert when the round began).
    Raises ValueError for a condition of another node or a repeated scope, and
    :class:`~dashboard.alerting.settings.UnknownRule` for a rule not in the rule settings, before
    changing anything.
    """
    settings = all_rule_settings()
    _check_conditions(node, conditions, settings)
    # The alerts open when the round began: read once, for the scopes a condition must match
    # and for the leftovers resolved at its end.
    if open_alerts is None:
        open_alerts = open_alerts_of(node)
    open_scopes = {alert.scope for alert in open_alerts}
    round_ = _Round(node, now, on_notice)
    notices: list[Notice] = []
    for condition in conditions:
        setting = settings[condition.rule]
        if setting.enabled and (condition.scope in open_scopes or condition.crosses_threshold()):
            notices.extend(round_.apply(condition, setting))
    rules_run = evaluated_rules if evaluated_rules is not None \
        else {condition.rule for condition in conditions}
    notices.extend(round_.resolve_leftovers(open_alerts, {c.scope for c in conditions},
                                            rules_run, settings))
    return notices


def alert_as_dict(alert: Alert) -> dict[str, Any]:
    """The alert as JSON-ready data for notification payloads and JSON endpoints.

    Times are ISO 8601 strings (or None); ``url`` is the alert page's path, to be joined to the
    public address by whoever sends it. ``cause`` is the cause it fired for (the latest one
    while pending), ``cause_now`` a different one named since ("" when none), ``figures`` the
    details as (label, text) rows. Cost: up to two queries (node and engine names).
    """
    return {
        "id": alert.pk,
        "rule": alert.rule,
        "scope": alert.scope,
        "state": alert.state,
        "severity": alert.severity,
        "node": alert.node.name,
        "engine": alert.engine.name if alert.engine_id else None,
        "summary": alert.summary,
        "cause": alert.cause,
        "cause_now": alert.cause_now,
        "details": alert.details,
        "figures": alert.figures,
        "value": alert.value,
        "threshold": alert.threshold,
        "clear": alert.clear,
        "started_at": _iso(alert.started_at),
        "fired_at": _iso(alert.fired_at),
        "resolved_at": _iso(alert.resolved_at),
        "resolve_reason": alert.resolve_reason,
        "notify_count": alert.notify_count,
        "url": reverse("dashboard:alert", args=[alert.pk]),
    }


def incidents(details: dict[str, Any], summary: str = "") -> dict[str, str]:
    """The incidents an alert's ``details`` name, by a stable key, each with a line for people.

    A restart is one incident (``restart_id``, told by ``restart_text``, else by ``summary``);
    each cause a rule lists (``causes[].component``, told by its ``text``) is one. Cost: none
    (no query).
    """
    found: dict[str, str] = {}
    restart = details.get("restart_id")
    if restart is not None:
        found[f"restart:{restart}"] = str(details.get("restart_text") or summary
                                          or f"restart {restart}")
    for cause in details.get("causes") or []:
        if isinstance(cause, dict) and cause.get("component"):
            found[f"cause:{cause['component']}"] = str(cause.get("text") or cause["component"])
    return found


def _latest_cause(condition: Condition) -> str:
    return str(condition.details.get("cause") or "")


def _told(summary: str, cause: str) -> str:
    """The rule's summary with the alert's cause, as the alert stores it (500 characters)."""
    return (f"{summary}; cause: {cause}" if cause else summary)[:500]


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _check_conditions(node: Node, conditions: Iterable[Condition],
                      settings: dict[str, EffectiveSetting]) -> None:
    seen: set[str] = set()
    for condition in conditions:
        if condition.node_id != node.pk:
            raise ValueError(f"condition {condition.scope} is not for node {node.name}")
        if condition.rule not in settings:
            raise UnknownRule(condition.rule)
        if condition.scope in seen:
            raise ValueError(f"two conditions for scope {condition.scope} in one round")
        seen.add(condition.scope)


def _lock_open(scope: str) -> Alert | None:
    """The open alert of ``scope``, row-locked until the transaction ends (None if none)."""
    return Alert.objects.select_for_update().filter(scope=scope, state__in=OPEN_STATES).first()


def _is_cleared(condition: Condition) -> bool:
    # Crossing wins over clearing, so a rule whose clear edge is on the wrong side of its
    # threshold keeps its alert open instead of opening and resolving it every round.
    return bool(condition.back_past_clear()) and not condition.crosses_threshold()


class _Stored:
    """An alert's columns as its round read them, so that a round which changes no state writes
    back only what it changed: a firing alert is evaluated every collection, and mostly only its
    evaluation time (and, when the rule refines them, its figures) moved."""

    def __init__(self, alert: Alert) -> None:
        # Copies, so that a JSON value changed in place still counts as changed.
        self.columns = {field.attname: copy.deepcopy(getattr(alert, field.attname))
                        for field in Alert._meta.concrete_fields if not field.primary_key}

    def save_changes(self, alert: Alert) -> None:
        changed = [name for name, value in self.columns.items()
                   if getattr(alert, name) != value]
        if changed:
            alert.save(update_fields=changed)


class _Round:
    """One evaluation round of one node: the time, its silences and where notices go."""

    def __init__(self, node: Node, now: datetime, on_notice: NoticeSink | None) -> None:
        self.node = node
        self.now = now
        self.on_notice = on_notice

    @cached_property
    def silences(self) -> list[Silence]:
        """The node's silences in force at the round's time: one query, made when an alert of
        the round first asks (a round that moves no alert makes none)."""
        return list(Silence.objects.active(self.now).for_node(self.node))

    # --- conditions -----------------------------------------------------------------------

    def apply(self, condition: Condition, setting: EffectiveSetting) -> list[Notice]:
        """Open, advance or resolve the alert of ``condition``'s scope; return its notice."""
        for attempt in (1, 2):
            try:
                with transaction.atomic():
                    alert = _lock_open(condition.scope)
                    if alert is None:
                        if condition.settled or not condition.crosses_threshold():
                            return []
                        alert = self._open(condition)
                    notice = self._advance(alert, condition, setting, _Stored(alert))
                    return [notice] if notice else []
            except IntegrityError:
                # Another evaluator opened this scope between our read and our insert. The
                # unique index made our insert wait for its commit, so a second read finds
                # its row and this condition is applied to it.
                if attempt == 2:
                    raise
        return []

    def _open(self, condition: Condition) -> Alert:
        alert = Alert.objects.create(
            rule=condition.rule, node=self.node, engine_id=condition.engine_id,
            scope=condition.scope, state=AlertState.PENDING, severity=condition.severity,
            summary=_told(condition.summary, _latest_cause(condition)),
            details=condition.details, value=condition.value,
            threshold=condition.threshold, clear=condition.clear, direction=condition.direction,
            started_at=self.now, last_evaluated_at=self.now, last_evaluation="active",
        )
        self._record(alert, "", f"condition active: value {alert.value_text} "
                                f"({alert.threshold_text})", None)
        return alert

    def _advance(self, alert: Alert, condition: Condition, setting: EffectiveSetting,
                 stored: _Stored) -> Notice | None:
        alert.last_evaluated_at = self.now
        if condition.settled:
            self._refresh(alert, condition)
            return self._resolve(alert, ResolveReason.SETTLED, condition.settled)
        if condition.value is None:
            alert.last_evaluation = "unknown"
            stored.save_changes(alert)
            return None
        known = incidents(alert.details or {})
        self._refresh(alert, condition)
        if _is_cleared(condition):
            return self._clear(alert, condition)
        if alert.state == AlertState.PENDING:
            held = (self.now - alert.started_at).total_seconds()
            if held >= setting.for_seconds - min(FOR_SLACK_SECONDS, setting.for_seconds / 10):
                return self._fire(alert, setting)
            stored.save_changes(alert)
            return None
        current = incidents(condition.details, condition.summary)
        news = tuple(text for key, text in current.items() if key not in known)
        return self._remind(alert, setting, stored, news)

    @staticmethod
    def _refresh(alert: Alert, condition: Condition) -> None:
        # The rule may refine its cause and numbers while the alert is open.
        alert.severity = condition.severity
        alert.details = condition.details
        # Once fired, the summary keeps telling the cause it fired for (``Alert.cause``).
        alert.summary = _told(condition.summary, alert.cause)
        alert.value = condition.value
        alert.threshold = condition.threshold
        alert.clear = condition.clear
        alert.direction = condition.direction
        alert.last_evaluation = "active" if condition.crosses_threshold() else "holding"

    def _fire(self, alert: Alert, setting: EffectiveSetting) -> Notice | None:
        alert.state = AlertState.FIRING
        alert.fired_at = self.now
        # What receivers are told it fired for; a later cause is a separate "since then" line.
        alert.fired_cause = alert.latest_cause[:500]
        message = f"active for {setting.for_seconds} s or more: firing"
        silence = self._silence_for(alert)
        if silence is not None:
            return self._record(alert, AlertState.PENDING,
                                f"{message}; silenced by {silence}, no notice", None)
        return self._record(alert, AlertState.PENDING, message, "firing")

    def _remind(self, alert: Alert, setting: EffectiveSetting, stored: _Stored,
                news: tuple[str, ...] = ()) -> Notice | None:
        """A still-firing alert: the held-back firing notice once unsilenced, an "updated"
        notice for new incidents, else a repeat when it is due."""
        if self._silence_for(alert) is not None:
            stored.save_changes(alert)
            return None
        if alert.notify_count == 0:
            return self._record(alert, AlertState.FIRING,
                                "no silence matches any more: firing notice issued now", "firing")
        if news:
            return self._record(alert, AlertState.FIRING,
                                f"new incident: {'; '.join(news)}", "updated", news)
        since = (self.now - alert.last_notified_at).total_seconds() \
            if alert.last_notified_at else None
        if since is not None and since >= setting.repeat_seconds:
            return self._record(alert, AlertState.FIRING,
                                f"still firing after {since:.0f} s: repeat notice", "repeat")
        stored.save_changes(alert)
        return None

    def _clear(self, alert: Alert, condition: Condition) -> Notice | None:
        reason = ResolveReason.CLEARED if alert.state == AlertState.FIRING \
            else ResolveReason.NEVER_FIRED
        return self._resolve(alert, reason, f"value {alert.value_text} back past the clear "
                                            f"edge {value_text(alert.rule, condition.clear)}")

    # --- alerts without a condition this round ----------------------------------------------

    def resolve_leftovers(self, open_alerts: list[OpenAlert], scopes: set[str],
                          rules_run: set[str],
                          settings: dict[str, EffectiveSetting]) -> list[Notice]:
        """Resolve open alerts of disabled rules, and of run rules whose scope has gone.

        ``open_alerts``: those open when the round began. One opened in the round has a
        condition (its scope is in ``scopes``); one resolved meanwhile by another evaluator is
        found so by the locked re-read."""
        notices: list[Notice] = []
        for open_alert in open_alerts:
            setting = settings.get(open_alert.rule)
            if setting is not None and not setting.enabled:
                reason, message = ResolveReason.RULE_DISABLED, "the rule was disabled"
            elif open_alert.rule in rules_run and open_alert.scope not in scopes:
                reason, message = (ResolveReason.NO_LONGER_APPLIES,
                                   "the rule ran without a condition for this scope "
                                   "(e.g. the engine is gone)")
            else:
                continue
            with transaction.atomic():
                # Re-read under lock: another evaluator may have resolved it meanwhile.
                alert = Alert.objects.select_for_update() \
                    .filter(pk=open_alert.pk, state__in=OPEN_STATES).first()
                notice = self._resolve(alert, reason, message) if alert else None
            if notice:
                notices.append(notice)
        return notices

    # --- shared steps -------------------------------------------------------------------------

    def _resolve(self, alert: Alert, reason: ResolveReason, message: str) -> Notice | None:
        """Resolve ``alert``; a resolved notice only if receivers had been told it fired."""
        from_state = alert.state
        alert.state = AlertState.RESOLVED
        alert.resolved_at = self.now
        alert.resolve_reason = reason
        alert.last_evaluated_at = self.now
        notice_kind: NoticeKind | None = "resolved" if alert.notify_count > 0 else None
        if notice_kind is None:
            message = f"{message}; no notice (none was sent for it)"
        return self._record(alert, from_state, f"resolved ({reason.value}): {message}", notice_kind)

    def _silence_for(self, alert: Alert) -> Silence | None:
        for silence in self.silences:
            if silence.matches(alert.rule, alert.node_id, alert.engine_id):
                return silence
        return None

    def _record(self, alert: Alert, from_state: str, message: str,
                notice_kind: NoticeKind | None, news: tuple[str, ...] = ()) -> Notice | None:
        """Save ``alert``, write its AlertEvent and, with a notice, count and hand it over."""
        notice = None
        if notice_kind is not None:
            alert.notify_count += 1
            alert.last_notified_at = self.now
            notice = Notice(alert, notice_kind, alert.notify_count, news)
        alert.save()
        AlertEvent.objects.create(alert=alert, at=self.now, from_state=from_state,
                                  to_state=alert.state, value=alert.value,
                                  notice=notice_kind or "", message=message)
        if notice is not None and self.on_notice is not None:
            self.on_notice(notice)
        return notice
