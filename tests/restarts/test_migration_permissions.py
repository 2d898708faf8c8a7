"""Migration 0004 of the dashboard: who could edit restart windows before still can after."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission, User

from tests.migrating import migrate, newest

BEFORE = [("dashboard", "0003_delivery_limits")]
AFTER = [("dashboard", "0004_config_permissions")]


@pytest.fixture
def migrations_undone():
    """The test database taken back before 0004, and to the newest migrations afterwards."""
    yield
    migrate(newest())


# Migrates the whole test database back and forth: seconds, not milliseconds.
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_restart_operators_get_the_window_permission_and_nobody_else(migrations_undone):
    migrate(BEFORE)
    # As on an installation from before 0004: the permission does not exist yet.
    Permission.objects.filter(codename="change_windows").delete()
    run_restarts = Permission.objects.get(codename="run_restarts")
    operator = User.objects.create_user("operator")
    operator.user_permissions.add(run_restarts)
    team = Group.objects.create(name="on-call")
    team.permissions.add(run_restarts)
    staff = User.objects.create_user("staff", is_staff=True)

    migrate(AFTER)

    assert User.objects.get(username="operator").has_perm("dashboard.change_windows")
    assert Group.objects.get(name="on-call").permissions.filter(
        codename="change_windows").exists()
    staff = User.objects.get(username="staff")
    assert not any(staff.has_perm(f"dashboard.{codename}") for codename in (
        "change_windows", "change_channels", "change_rules", "change_silences"))

    # The later move to the restarts app takes the grant along.
    migrate(newest())
    assert User.objects.get(username="operator").has_perm("restarts.change_windows")
    assert not User.objects.get(username="staff").has_perm("restarts.change_windows")
