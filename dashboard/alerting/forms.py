"""Forms of the alerting pages: a new silence, and one rule's overrides.

Both validate with the same functions the domain code uses (``silences.create_silence`` and
``rules.base.ThresholdSpec.problem`` / ``settings.timing_problem``), so the page and the code
agree on what is acceptable, and an invalid submission saves nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from collectors.models import Engine, Node
from dashboard.alerting.models import RuleSetting, Silence
from dashboard.alerting.rules import RULES, Rule
from dashboard.alerting.settings import (
    FOR_SECONDS_MAX,
    REPEAT_SECONDS_MAX,
    REPEAT_SECONDS_MIN,
    timing_problem,
)
from dashboard.alerting.silences import (
    alerts_it_would_mute,
    broad_reasons,
    create_silence,
    length_problem,
)

DATETIME_LOCAL = "%Y-%m-%dT%H:%M"


class EngineChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Engine) -> str:
        return f"{obj.node.name} / {obj.name}"


class SilenceForm(forms.Form):
    """A silence starting now. Empty node, rule or engine means "any".

    Longer than ``SPARKOPS_SILENCE_MAX_DAYS`` is refused. A broad one (every rule on every node,
    or longer than a day) is refused until ``confirm_broad`` is ticked: the first submission
    sets ``broad`` (the reasons) and ``would_mute`` (the open alerts it would mute) for the page
    to show, and saves nothing.
    """

    node = forms.ModelChoiceField(Node.objects.all(), required=False, empty_label="any node")
    rule = forms.ChoiceField(required=False, choices=[("", "any rule")] + [
        (rule, f"{defaults.title} ({rule})") for rule, defaults in RULES.items()
    ])
    engine = EngineChoiceField(Engine.objects.select_related("node"), required=False,
                               empty_label="any engine")
    ends_at = forms.DateTimeField(
        label="Ends at", input_formats=[DATETIME_LOCAL, "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format=DATETIME_LOCAL),
        help_text=f"In {timezone.get_default_timezone_name()}.",
    )
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), max_length=2000,
                             help_text="Why these alerts may stay quiet (kept as history).")
    confirm_broad = forms.BooleanField(required=False, label="Yes, mute all of this")

    def __init__(self, *args: Any, now: datetime, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.now = now
        self.broad: list[str] = []
        self.would_mute: list[Any] = []

    def clean_ends_at(self) -> datetime:
        ends_at = self.cleaned_data["ends_at"]
        if ends_at <= self.now:
            raise forms.ValidationError("The end must be in the future.")
        problem = length_problem(self.now, ends_at)
        if problem:
            raise forms.ValidationError(f"{problem[0].upper()}{problem[1:]}.")
        return ends_at

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        node, engine = cleaned.get("node"), cleaned.get("engine")
        if node is not None and engine is not None and engine.node_id != node.pk:
            self.add_error("engine", f"Engine {engine.name} is not on node {node.name}.")
        if self.errors or "ends_at" not in cleaned:
            return cleaned
        matchers = {"node": node, "rule": cleaned.get("rule", ""), "engine": engine}
        self.broad = broad_reasons(**matchers, length=cleaned["ends_at"] - self.now)
        if self.broad and not cleaned.get("confirm_broad"):
            self.would_mute = alerts_it_would_mute(**matchers)
            self.add_error("confirm_broad", "This silence is broad ("
                           + "; ".join(self.broad) + "): check what it would mute, then tick "
                           "\"Yes, mute all of this\" and submit again.")
        return cleaned

    @property
    def needs_confirmation(self) -> bool:
        """Whether the page should show the broad-silence confirmation."""
        return bool(self.broad) and "confirm_broad" in self.errors

    def save(self, user: AbstractBaseUser | None) -> Silence:
        data = self.cleaned_data
        return create_silence(reason=data["reason"], ends_at=data["ends_at"], now=self.now,
                              node=data["node"], rule=data["rule"], engine=data["engine"],
                              created_by=user)


class RuleSettingForm(forms.Form):
    """One rule's overrides. A blank field means "use the documented default"."""

    enabled = forms.BooleanField(required=False)
    for_seconds = forms.IntegerField(
        required=False, label="For (s)",
        widget=forms.NumberInput(attrs={"min": 0, "max": FOR_SECONDS_MAX}),
    )
    repeat_seconds = forms.IntegerField(
        required=False, label="Repeat every (s)",
        widget=forms.NumberInput(attrs={"min": REPEAT_SECONDS_MIN, "max": REPEAT_SECONDS_MAX}),
    )

    THRESHOLD_PREFIX = "threshold_"

    def __init__(self, *args: Any, defaults: Rule, stored: RuleSetting | None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("initial", _initial(stored))
        super().__init__(*args, **kwargs)
        self.defaults = defaults
        self.fields["for_seconds"].help_text = f"Default {defaults.for_seconds} s."
        self.fields["for_seconds"].widget.attrs["placeholder"] = defaults.for_seconds
        self.fields["repeat_seconds"].help_text = f"Default {defaults.repeat_seconds} s."
        self.fields["repeat_seconds"].widget.attrs["placeholder"] = defaults.repeat_seconds
        for spec in defaults.thresholds:
            self.fields[self.THRESHOLD_PREFIX + spec.key] = forms.FloatField(
                required=False, label=f"{spec.label} ({spec.unit})",
                help_text=f"{spec.help} Default {spec.default:g}.",
                widget=forms.NumberInput(attrs={"step": "any", "min": spec.minimum,
                                                "max": spec.maximum,
                                                "placeholder": f"{spec.default:g}"}),
            )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        for name, label in (("for_seconds", "For"), ("repeat_seconds", "Repeat every")):
            value = cleaned.get(name)
            problem = timing_problem(name, value) if value is not None else None
            if problem:
                self.add_error(name, f"{label} {problem}")
        for spec in self.defaults.thresholds:
            value = cleaned.get(self.THRESHOLD_PREFIX + spec.key)
            problem = spec.problem(value) if value is not None else None
            if problem:
                self.add_error(self.THRESHOLD_PREFIX + spec.key, problem)
        return cleaned

    def save(self, user: AbstractBaseUser | None, now: datetime) -> RuleSetting:
        data = self.cleaned_data
        thresholds = {
            spec.key: data[self.THRESHOLD_PREFIX + spec.key]
            for spec in self.defaults.thresholds
            if data.get(self.THRESHOLD_PREFIX + spec.key) is not None
        }
        setting, _ = RuleSetting.objects.update_or_create(
            rule=self.defaults.name,
            defaults={"enabled": data["enabled"], "for_seconds": data["for_seconds"],
                      "repeat_seconds": data["repeat_seconds"], "thresholds": thresholds,
                      "updated_at": now, "updated_by": user},
        )
        return setting


def _initial(stored: RuleSetting | None) -> dict[str, Any]:
    if stored is None:
        return {"enabled": True}
    initial: dict[str, Any] = {"enabled": stored.enabled, "for_seconds": stored.for_seconds,
                               "repeat_seconds": stored.repeat_seconds}
    for key, value in (stored.thresholds or {}).items():
        initial[RuleSettingForm.THRESHOLD_PREFIX + key] = value
    return initial
