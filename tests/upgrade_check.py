"""Upgrade a database built as the single ``dashboard`` app left it, and report what survived.

Run as ``python -m tests.upgrade_check`` with ``DATABASE_URL`` naming an empty database. It
migrates to the migrations the single-app release ended at, creates the content types and
permissions its ``migrate`` created, writes rows of every model that moved and grants through a
user and a group, runs ``manage.py migrate`` as an upgrade does, and prints one JSON line of
facts for tests/test_migrate_from_previous_main.py to check.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sparkops.settings")
django.setup()

from django.apps.registry import Apps  # noqa: E402
from django.contrib.auth.management import create_permissions  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from tests.migrating import migrate, newest  # noqa: E402

# Where the single-app release ended: collectors 0005 and dashboard 0004, plus Django's and
# axes' own migrations.
MOVED_APPS = ("alerting", "notify", "restarts", "audit")
OURS = ("collectors", "dashboard", *MOVED_APPS)
PREVIOUS = [("collectors", "0005_mask_engine_secrets"), ("dashboard", "0004_config_permissions")]
T0 = datetime(2026, 11, 1, 3, 0, tzinfo=UTC)
# Grants held before the upgrade: (codename, held by the user, held by the group).
GRANTS = {
    "run_restarts": "user", "change_windows": "user", "view_audit": "user",
    "change_channels": "group", "change_rules": "group", "change_silences": "group",
    "unlock_logins": "group",
}
# The model (app label, name) each moved table belongs to now, with its table.
MOVED = {
    "alert": ("alerting", "Alert"), "alertevent": ("alerting", "AlertEvent"),
    "silence": ("alerting", "Silence"), "rulesetting": ("alerting", "RuleSetting"),
    "channel": ("notify", "Channel"), "notification": ("notify", "Notification"),
    "restartwindow": ("restarts", "RestartWindow"), "restart": ("restarts", "Restart"),
    "restartstep": ("restarts", "RestartStep"), "auditentry": ("audit", "AuditEntry"),
}


def build_previous_release() -> dict[str, Any]:
    """The database as the previous release's ``migrate`` left it, with rows and grants."""
    leaves = [leaf for leaf in newest() if leaf[0] not in OURS]
    old = migrate(PREVIOUS + leaves)
    # What that release's post_migrate created: content types and permissions of its models.
    for label in {model._meta.app_label for model in old.get_models()}:
        create_permissions(SimpleNamespace(label=label, models_module=True), verbosity=0,
                           apps=old)
    rows = write_rows(old)
    permission = old.get_model("auth", "Permission")
    user = old.get_model("auth", "User").objects.create(username="operator")
    group = old.get_model("auth", "Group").objects.create(name="on-call")
    member = old.get_model("auth", "User").objects.create(username="member")
    member.groups.add(group)
    for codename, holder in GRANTS.items():
        granted = permission.objects.get(content_type__app_label="dashboard", codename=codename)
        (user.user_permissions if holder == "user" else group.permissions).add(granted)
    return rows


def write_rows(old: Apps) -> dict[str, list[int]]:
    """One or two rows of every model that moves; their ids by model."""
    model = old.get_model
    node = model("collectors", "Node").objects.create(name="spark-old", hostname="spark-old")
    engine = model("collectors", "Engine").objects.create(
        node_id=node.pk, name="vllm-a", container_id="c" * 64, container_state="running")
    alert = model("dashboard", "Alert").objects.create(
        node_id=node.pk, engine_id=engine.pk, rule="headroom-floor", scope="spark-old",
        state="firing", severity="critical", summary="headroom 1.2 GiB", threshold=4.0,
        started_at=T0, last_evaluated_at=T0)
    event = model("dashboard", "AlertEvent").objects.create(alert_id=alert.pk, at=T0,
                                                            to_state="firing")
    silence = model("dashboard", "Silence").objects.create(
        node_id=node.pk, starts_at=T0, ends_at=T0, reason="maintenance", created_at=T0)
    setting = model("dashboard", "RuleSetting").objects.create(rule="queue-backlog",
                                                               enabled=False)
    channel = model("dashboard", "Channel").objects.create(name="ops", kind="email",
                                                           config={"to": ["ops@example.com"]})
    notification = model("dashboard", "Notification").objects.create(
        channel_id=channel.pk, kind="firing", alert_id=alert.pk, subject="s", text="t")
    window = model("dashboard", "RestartWindow").objects.create(
        node_id=node.pk, name="sunday", recurrence="RRULE:FREQ=WEEKLY", time_zone="UTC",
        duration_minutes=60)
    restarts = [model("dashboard", "Restart").objects.create(
        node_id=node.pk, engine_id=engine.pk, kind="planned", status=status,
        window_id=window.pk) for status in ("succeeded", "scheduled")]
    step = model("dashboard", "RestartStep").objects.create(restart_id=restarts[0].pk,
                                                            step="drain", started_at=T0)
    audit = model("dashboard", "AuditEntry").objects.create(
        action="plan-restart", allowed=True, restart_id=restarts[0].pk, node_id=node.pk,
        address="192.0.2.7", details={"why": "kv pool"})
    return {"alert": [alert.pk], "alertevent": [event.pk], "silence": [silence.pk],
            "rulesetting": [setting.pk], "channel": [channel.pk],
            "notification": [notification.pk], "restartwindow": [window.pk],
            "restart": [r.pk for r in restarts], "restartstep": [step.pk],
            "auditentry": [audit.pk]}


def facts_after_upgrade() -> dict[str, Any]:
    """What the upgraded database holds, read through the current models."""
    from django.apps import apps
    from django.contrib.auth.models import Group, Permission, User
    from django.contrib.contenttypes.models import ContentType

    rows = {key: sorted(apps.get_model(*name).objects.values_list("pk", flat=True))
            for key, name in MOVED.items()}
    restart = apps.get_model("restarts", "Restart").objects.order_by("pk").first()
    entry = apps.get_model("audit", "AuditEntry").objects.get()
    operator, member = User.objects.get(username="operator"), User.objects.get(username="member")
    return {
        "rows": rows,
        "links": {"restart.window": restart.window.name,
                  "audit.restart": entry.restart_id == restart.pk,
                  "audit.address": entry.address,
                  "notification.channel": apps.get_model("notify", "Notification")
                  .objects.get().channel.name,
                  "alert.engine": apps.get_model("alerting", "Alert").objects.get().engine.name},
        "operator": sorted(p for p in operator.get_all_permissions()
                           if p.split(".")[1] in GRANTS),
        "member": sorted(p for p in member.get_all_permissions()
                         if p.split(".")[1] in GRANTS),
        "group": sorted(Group.objects.get().permissions.values_list("codename", flat=True)),
        "dashboard_content_types": list(ContentType.objects.filter(app_label="dashboard")
                                        .values_list("model", flat=True)),
        "permission_rows": {codename: Permission.objects.filter(codename=codename).count()
                            for codename in GRANTS},
        "schema": schema_mismatches(),
    }


def schema_mismatches() -> list[str]:
    """Where a moved table differs from its model: columns, and named indexes/constraints."""
    from django.apps import apps

    found = []
    with connection.cursor() as cursor:
        for label, name in MOVED.values():
            meta = apps.get_model(label, name)._meta
            columns = {c.name for c in connection.introspection.get_table_description(
                cursor, meta.db_table)}
            expected = {field.column for field in meta.concrete_fields}
            if columns != expected:
                found.append(f"{meta.db_table}: columns {sorted(columns ^ expected)}")
            named = {item.name for item in [*meta.indexes, *meta.constraints]}
            present = set(connection.introspection.get_constraints(cursor, meta.db_table))
            if named - present:
                found.append(f"{meta.db_table}: missing {sorted(named - present)}")
    return found


def main() -> None:
    written = build_previous_release()
    call_command("migrate", verbosity=0, interactive=False)
    print(json.dumps({"written": written, **facts_after_upgrade()}))


if __name__ == "__main__":
    main()
