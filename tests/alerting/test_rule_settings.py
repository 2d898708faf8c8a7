"""Rule defaults, admins' overrides merged on top, and the scaled headroom floor."""

from __future__ import annotations

import pytest

from dashboard.alerting.models import RuleSetting
from dashboard.alerting.rules import DEFAULT_REPEAT_SECONDS, RULES
from dashboard.alerting.rules.headroom_floor import floor_gib
from dashboard.alerting.settings import (
    UnknownRule,
    all_rule_settings,
    duration_text,
    rule_defaults,
    rule_settings,
)
from sparkops.units import GIB


@pytest.mark.parametrize(("rule", "for_seconds", "thresholds"), [
    ("prefill-squeeze", 10, {"margin_gib": 2.0, "hysteresis_gib": 0.5,
                             "lookback_minutes": 30.0}),
    ("headroom-floor", 30, {"floor_gib": 8.0, "floor_percent": 6.5,
                            "swap_growth_mib_per_min": 256.0, "hysteresis_gib": 1.0}),
    ("queue-backlog", 30, {"waiting_seconds": 15.0}),
    ("prefill-stall", 0, {"decode_collapse_fraction": 0.25, "min_duration_seconds": 10.0}),
    ("engine-down", 60, {}),
    ("overcommit", 0, {"margin_gib": 0.0, "hysteresis_gib": 0.5}),
])
def test_documented_defaults(db, rule, for_seconds, thresholds):
    setting = rule_settings(rule)

    assert (setting.enabled, setting.for_seconds, setting.repeat_seconds) == \
        (True, for_seconds, 4 * 3600)
    assert setting.thresholds == thresholds
    assert setting.overridden == frozenset()


def test_overrides_apply_on_top_of_defaults(db):
    RuleSetting.objects.create(rule="headroom-floor", for_seconds=5, thresholds={"floor_gib": 4})

    setting = rule_settings("headroom-floor")

    assert (setting.for_seconds, setting.repeat_seconds) == (5, DEFAULT_REPEAT_SECONDS)
    assert setting.thresholds == {"floor_gib": 4.0, "floor_percent": 6.5,
                                  "swap_growth_mib_per_min": 256.0, "hysteresis_gib": 1.0}
    assert setting.overridden == {"for_seconds", "floor_gib"}


def test_invalid_stored_overrides_are_ignored_not_applied(db):
    RuleSetting.objects.create(rule="queue-backlog", for_seconds=10**7, repeat_seconds=5,
                               thresholds={"waiting_seconds": -3, "no_such": 1,
                                           "min_duration_seconds": 2})

    setting = rule_settings("queue-backlog")

    assert (setting.for_seconds, setting.repeat_seconds) == (30, DEFAULT_REPEAT_SECONDS)
    assert setting.thresholds == {"waiting_seconds": 15.0}


def test_unknown_rule_is_an_error(db):
    with pytest.raises(UnknownRule):
        rule_settings("no-such-rule")


def test_the_registry_holds_every_rule_once_in_documentation_order():
    assert list(RULES) == ["prefill-squeeze", "predicted-squeeze", "headroom-floor",
                           "fragmentation", "queue-backlog", "prefill-stall", "engine-down",
                           "node-unreachable", "orphan-rank", "overcommit",
                           "unplanned-restart", "restart-failed", "unexpected-reboot",
                           "memory-not-returned"]
    assert all(rule.name == name for name, rule in RULES.items())
    assert rule_defaults("unplanned-restart") is RULES["unplanned-restart"]
    assert (RULES["unplanned-restart"].repeat_seconds, RULES["restart-failed"].repeat_seconds) \
        == (24 * 3600, DEFAULT_REPEAT_SECONDS)
    with pytest.raises(UnknownRule):
        rule_defaults("no-such-rule")


def test_all_rule_settings_lists_every_rule_in_order(db):
    RuleSetting.objects.create(rule="overcommit", enabled=False)

    settings = all_rule_settings()

    assert list(settings) == list(RULES)
    assert settings["overcommit"].enabled is False
    assert "enabled" in settings["overcommit"].overridden


@pytest.mark.parametrize(("mem_total_gib", "expected"), [
    (121.69, 0.065 * 121.69),  # a GB10 unit: 6.5 % is just under 8 GiB
    (128.0, 8.0),
    (64.0, 0.065 * 64),
    (None, 8.0),  # MemTotal unknown: the absolute floor, never a share of a guess
])
def test_headroom_floor_scales_down_on_small_machines(db, mem_total_gib, expected):
    setting = rule_settings("headroom-floor")
    total = None if mem_total_gib is None else int(mem_total_gib * GIB)

    assert floor_gib(setting.thresholds, total) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (45, "45 s"), (90, "90 s"), (600, "10 min"), (14_400, "4 h"), (5_400, "1 h 30 min"),
])
def test_durations_read_naturally(seconds, text):
    assert duration_text(seconds) == text
