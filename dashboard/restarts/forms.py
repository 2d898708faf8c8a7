"""Forms of the restart pages: a restart window, and a plan (with, optionally, the engine's new
launch command and how it comes into force).

Both validate with the domain functions (``windows.build_recurrence`` / ``windows.check_window``;
``planning.plan_restart`` has the last word on a plan), so the page and the code agree on what is
acceptable, and an invalid submission saves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import available_timezones

from django import forms
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q
from django.utils import timezone

from collectors.models import Engine, Node
from dashboard.restarts.change import MODES, NOTE
from dashboard.restarts.models import RestartWindow
from dashboard.restarts.windows import (
    MAX_DURATION_MINUTES,
    WindowOccurrence,
    build_recurrence,
    check_window,
    current_or_next,
    occurrences,
    resolve_zone,
    split_recurrence,
)
from sparkops.timetext import clock_text, same_clock, span_text, zone_name

DATETIME_LOCAL = "%Y-%m-%dT%H:%M"
INPUT_FORMATS = [DATETIME_LOCAL, "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"]
NOW = "now"
# Room for a ~10-minute start (or two, serialised) with margin.
DEFAULT_DURATION_MINUTES = 120
WINDOW_PREFIX = "window:"
# Openings compared with the node's other windows: five weeks holds every weekly pattern and
# the next opening of most monthly ones, and stays well inside the expansion bound.
OVERLAP_HORIZON = timedelta(days=35)
# Overlaps listed on the confirmation; one is enough to decide, a few show the pattern.
OVERLAPS_SHOWN = 5


@dataclass(frozen=True)
class Overlap:
    """One opening of the window being saved that overlaps one of ``other``'s (UTC)."""

    other: RestartWindow
    start: datetime
    end: datetime
    other_start: datetime
    other_end: datetime


class WallClockField(forms.DateTimeField):
    """A date and time exactly as typed, in no zone: the window names its own zone.

    Django's DateTimeField would read the input in the site's zone (and reject a wall-clock time
    that does not exist there); a window's start belongs to the zone picked beside it.
    """

    def to_python(self, value: Any) -> datetime | None:
        if value in self.empty_values:
            return None
        if isinstance(value, datetime):
            return value.replace(tzinfo=None)
        # BaseTemporalField.to_python: strptime over input_formats, no zone conversion.
        return super(forms.DateTimeField, self).to_python(value)


class EngineChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Engine) -> str:
        return f"{obj.node.name} / {obj.name}"


class RestartWindowForm(forms.ModelForm):
    """A window: who it applies to, when it first opens (local time in its zone), its RRULE line
    and how long each opening lasts."""

    local_start = WallClockField(
        label="First opening (local time)", input_formats=INPUT_FORMATS,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format=DATETIME_LOCAL),
        help_text="Wall-clock time in the zone below; later openings keep this local time "
                  "across daylight-saving changes.",
    )
    time_zone = forms.CharField(
        label="Time zone", max_length=64,
        widget=forms.TextInput(attrs={"list": "time-zones", "autocomplete": "off"}),
        help_text="IANA name, e.g. Asia/Seoul or Europe/Berlin.",
    )
    rrule = forms.CharField(
        label="Repeats (RRULE)", max_length=500,
        help_text="RFC 5545 rule, e.g. FREQ=WEEKLY;BYDAY=SU (every Sunday) or "
                  "FREQ=MONTHLY;BYDAY=1SA (first Saturday of the month).",
    )
    duration_minutes = forms.IntegerField(
        label="Lasts (minutes)", min_value=1, max_value=MAX_DURATION_MINUTES,
        help_text="Elapsed time of each opening; an engine takes about 10 minutes to start.",
    )
    engine = EngineChoiceField(Engine.objects.select_related("node"), required=False,
                               empty_label="every engine of the node")
    confirm_overlap = forms.BooleanField(
        required=False, label="Yes, save it although its openings overlap these windows")

    field_order = ["name", "node", "engine", "local_start", "time_zone", "rrule",
                   "duration_minutes", "enabled", "confirm_overlap"]
    OVERLAP_DAYS = OVERLAP_HORIZON.days

    class Meta:
        model = RestartWindow
        fields = ["name", "node", "engine", "enabled", "duration_minutes"]

    def __init__(self, *args: Any, now: datetime, **kwargs: Any) -> None:
        instance: RestartWindow | None = kwargs.get("instance")
        if instance is not None and instance.pk:
            defaults = _window_initial(instance)
        else:
            defaults = {"time_zone": timezone.get_default_timezone_name(),
                        "duration_minutes": DEFAULT_DURATION_MINUTES, "enabled": True}
        kwargs["initial"] = {**defaults, **(kwargs.get("initial") or {})}
        super().__init__(*args, **kwargs)
        self.now = now
        self.fields["node"].queryset = Node.objects.all()
        self.overlaps: list[Overlap] = []

    @staticmethod
    def zone_names() -> list[str]:
        return sorted(available_timezones())

    def clean_time_zone(self) -> str:
        try:
            return resolve_zone(self.cleaned_data["time_zone"]).key
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        node, engine = cleaned.get("node"), cleaned.get("engine")
        if node is not None and engine is not None and engine.node_id != node.pk:
            self.add_error("engine", f"Engine {engine.name} is not on node {node.name}.")
        needed = ("local_start", "time_zone", "rrule", "duration_minutes")
        if any(cleaned.get(name) is None for name in needed):
            return cleaned  # a field error is already shown
        try:
            recurrence = build_recurrence(cleaned["local_start"], cleaned["time_zone"],
                                          cleaned["rrule"])
            first = check_window(recurrence, cleaned["duration_minutes"], self.now)
        except ValueError as error:
            self.add_error("rrule", str(error))
            return cleaned
        cleaned["recurrence"] = recurrence
        self._confirm_overlaps(cleaned, first)
        return cleaned

    def _confirm_overlaps(self, cleaned: dict[str, Any], first: WindowOccurrence) -> None:
        """Refuse, until ``confirm_overlap`` is ticked, a window whose openings overlap those of
        another enabled window for the same node and engine: two windows that overlap usually
        mean one was meant to replace the other, and either would let a restart start."""
        if not cleaned.get("enabled") or cleaned.get("node") is None:
            return
        candidate = RestartWindow(recurrence=cleaned["recurrence"],
                                  duration_minutes=cleaned["duration_minutes"])
        self.overlaps = overlapping_openings(candidate, cleaned["node"], cleaned.get("engine"),
                                             first.start, exclude=self.instance.pk)
        if self.overlaps and not cleaned.get("confirm_overlap"):
            names = ", ".join(dict.fromkeys(overlap.other.name for overlap in self.overlaps))
            self.add_error("confirm_overlap", f"Its openings overlap those of window {names} "
                           "(listed below); tick the box to save it anyway.")

    def needs_confirmation(self) -> bool:
        """Whether the page should show the overlap confirmation."""
        return bool(self.overlaps) and "confirm_overlap" in self.errors

    def overlap_rows(self) -> list[dict[str, str]]:
        """The overlaps for the page, each opening in its own window's zone, zone named."""
        rows = []
        zone = resolve_zone(self.cleaned_data.get("time_zone") or "UTC")
        for overlap in self.overlaps:
            other_zone = resolve_zone(overlap.other.time_zone)
            rows.append({
                "other": overlap.other.name,
                "this": f"{span_text(overlap.start, overlap.end, zone)} {zone_name(zone)}",
                "theirs": f"{span_text(overlap.other_start, overlap.other_end, other_zone)} "
                          f"{zone_name(other_zone)}",
            })
        return rows

    def save_window(self, user: AbstractBaseUser | None) -> RestartWindow:
        """Save the window with its built recurrence; ``user`` is recorded on creation."""
        window: RestartWindow = super().save(commit=False)
        window.recurrence = self.cleaned_data["recurrence"]
        window.time_zone = self.cleaned_data["time_zone"]
        if window.pk is None:
            window.created_by = user if getattr(user, "is_authenticated", False) else None
            window.created_at = self.now
        window.save()
        return window


class PlanForm(forms.Form):
    """A plan on one node: which manageable engine, in which window (or now), and why; and,
    optionally, the engine's new launch command with how it comes into force (``command``,
    ``mode``, ``accept_squeeze``: ``cleaned_data["change"]`` holds them, None without a
    command). The fit planner's verdict on the command is ``plan_restart``'s."""

    engine = EngineChoiceField(Engine.objects.none(), empty_label=None)
    when = forms.ChoiceField(label="When")
    start_at = forms.DateTimeField(
        label="Not before (optional)", required=False, input_formats=INPUT_FORMATS,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format=DATETIME_LOCAL),
        help_text=f"In {timezone.get_default_timezone_name()}; a time inside the chosen window. "
                  "Empty: the window's next opening.",
    )
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), max_length=2000,
                             help_text="Why this engine goes down (kept in the ledger).")
    command = forms.CharField(
        label="New launch command (optional)", required=False, max_length=20000,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="The engine's next `vllm serve …` command line (or compose service). The fit "
                  "planner checks it now and again before the restart; empty: same flags.")
    mode = forms.ChoiceField(label="The new command comes into force by", choices=MODES.items(),
                             initial=NOTE, required=False)
    accept_squeeze = forms.BooleanField(
        label="Plan it even if the new flags squeeze a neighbour's prefill", required=False)

    def __init__(self, *args: Any, node: Node, now: datetime, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.node = node
        self.engines = plannable_engines(node)
        self.windows = list(RestartWindow.objects.filter(node=node, enabled=True)
                            .select_related("engine"))
        # Validate against every engine of the node but offer only the plannable ones: a crafted
        # POST naming an unmanaged engine then reaches plan_restart, which refuses and audits it.
        engine_field = self.fields["engine"]
        engine_field.queryset = Engine.objects.filter(node=node).select_related("node")
        engine_field.widget.choices = [(engine.pk, engine_field.label_from_instance(engine))
                                       for engine in self.engines]
        self.fields["when"].choices = [(NOW, "now")] + [
            (f"{WINDOW_PREFIX}{window.pk}", _window_label(window, now))
            for window in self.windows
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        when = cleaned.get("when")
        cleaned["window"] = None
        if when and when.startswith(WINDOW_PREFIX):
            window_id = when.removeprefix(WINDOW_PREFIX)
            cleaned["window"] = next(w for w in self.windows if str(w.pk) == window_id)
        elif cleaned.get("start_at") is not None:
            self.add_error("start_at", "A start time needs a window; \"now\" starts now.")
        command = (cleaned.get("command") or "").strip()
        cleaned["change"] = {"command": command, "mode": cleaned.get("mode") or NOTE,
                             "accept_squeeze": bool(cleaned.get("accept_squeeze"))} \
            if command else None
        return cleaned


def plannable_engines(node: Node) -> list[Engine]:
    """Engines of ``node`` a plan may name: present, and enabled for management."""
    present = Engine.objects.filter(node=node, present=True).select_related("node")
    return [engine for engine in present if engine.manageable]


def overlapping_openings(candidate: RestartWindow, node: Node, engine: Engine | None,
                         since: datetime, *, exclude: int | None = None) -> list[Overlap]:
    """Openings of ``candidate`` in the :data:`OVERLAP_HORIZON` from ``since`` (its current or
    next opening) that overlap an opening of
    another enabled window of ``node`` applying to the same engines (a node window applies to
    every engine), at most :data:`OVERLAPS_SHOWN`, earliest first.

    A stored window that can no longer be expanded is skipped (its page says why). Cost: one
    query, and one bounded expansion per window of the node.
    """
    others = RestartWindow.objects.filter(node=node, enabled=True).exclude(pk=exclude)
    if engine is not None:
        others = others.filter(Q(engine__isnull=True) | Q(engine=engine))
    end = since + OVERLAP_HORIZON
    mine = occurrences(candidate, since, end)
    found: list[Overlap] = []
    for other in others.order_by("name", "pk"):
        try:
            theirs = occurrences(other, since, end)
        except ValueError:
            continue
        found += [Overlap(other, a.start, a.end, b.start, b.end)
                  for a, b in _overlapping_pairs(mine, theirs)]
    found.sort(key=lambda overlap: overlap.start)
    return found[:OVERLAPS_SHOWN]


def _overlapping_pairs(mine: list[WindowOccurrence], theirs: list[WindowOccurrence]
                       ) -> list[tuple[WindowOccurrence, WindowOccurrence]]:
    """Pairs that overlap, by a merge of the two sorted lists: linear, not quadratic."""
    pairs, j = [], 0
    for a in mine:
        while j < len(theirs) and theirs[j].end <= a.start:
            j += 1
        k = j
        while k < len(theirs) and theirs[k].start < a.end:
            pairs.append((a, theirs[k]))
            k += 1
    return pairs


def _window_initial(window: RestartWindow) -> dict[str, Any]:
    try:
        local_start, zone, rule = split_recurrence(window.recurrence)
    except ValueError:
        return {"time_zone": window.time_zone}
    return {"local_start": local_start, "time_zone": zone, "rrule": rule}


def _window_label(window: RestartWindow, now: datetime) -> str:
    scope = f" (only {window.engine.name})" if window.engine_id else ""
    try:
        found = current_or_next(window, now)
    except ValueError as error:
        return f"window {window.name}{scope}: unreadable ({error})"
    if found is None:
        return f"window {window.name}{scope}: no further opening"
    zone, viewer = resolve_zone(window.time_zone), timezone.get_current_timezone()
    own = "" if same_clock(found.start, zone, viewer) else (
        f" ({span_text(found.start, found.end, zone)} in the window's zone, {window.time_zone})")
    if found.contains(now):
        return (f"window {window.name}{scope}: open now until "
                f"{clock_text(found.end, viewer)}{own}")
    return f"window {window.name}{scope}: next {span_text(found.start, found.end, viewer)}{own}"
