"""Permissions for configuration changes, and the client address on audit rows.

Who may change what: ``change_channels``, ``change_rules``, ``change_silences`` and
``change_windows`` (before, any staff account could change channels, rules and silences, and the
restart permission covered windows); ``view_audit`` and ``unlock_logins`` for the audit and
login pages. Superusers hold them all.

Existing holders of ``run_restarts`` (users and groups) are granted ``change_windows``, so those
who could edit windows still can. Nobody is granted the others: "staff" no longer implies them,
and an administrator decides who gets them (Django admin, Users or Groups).
"""

from django.db import migrations, models

GRANT_FROM = "run_restarts"
GRANT = ("change_windows", "Can create and edit restart windows", "restartwindow")


def grant_windows_to_restart_operators(apps, schema_editor):
    """Give ``change_windows`` to whoever holds ``run_restarts``; a fresh database has nobody.

    Permissions are normally created after migrating; the one granted here is created now, with
    the codename and name the model declares, so the later pass finds it in place.
    """
    Permission = apps.get_model("auth", "Permission")
    ContentType = apps.get_model("contenttypes", "ContentType")
    Group = apps.get_model("auth", "Group")
    User = apps.get_model("auth", "User")
    source = Permission.objects.filter(content_type__app_label="dashboard",
                                       codename=GRANT_FROM).first()
    if source is None:
        return
    users = User.objects.filter(user_permissions=source)
    groups = Group.objects.filter(permissions=source)
    if not users.exists() and not groups.exists():
        return
    codename, name, model = GRANT
    content_type, _ = ContentType.objects.get_or_create(app_label="dashboard", model=model)
    granted, _ = Permission.objects.get_or_create(content_type=content_type, codename=codename,
                                                  defaults={"name": name})
    for user in users:
        user.user_permissions.add(granted)
    for group in groups:
        group.permissions.add(granted)


class Migration(migrations.Migration):

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("dashboard", "0003_delivery_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditentry",
            name="address",
            field=models.GenericIPAddressField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="auditentry",
            index=models.Index(fields=["at"], name="audit_at"),
        ),
        migrations.AlterModelOptions(
            name="auditentry",
            options={"ordering": ["-at"],
                     "permissions": [("view_audit", "Can read the audit log"),
                                     ("unlock_logins", "Can see login lockouts and lift them")]},
        ),
        migrations.AlterModelOptions(
            name="channel",
            options={"ordering": ["name", "pk"],
                     "permissions": [("change_channels",
                                      "Can create, edit, enable and disable channels")]},
        ),
        migrations.AlterModelOptions(
            name="rulesetting",
            options={"permissions": [("change_rules", "Can change alert rule settings")]},
        ),
        migrations.AlterModelOptions(
            name="silence",
            options={"ordering": ["-ends_at", "-id"],
                     "permissions": [("change_silences", "Can create and expire silences")]},
        ),
        migrations.AlterModelOptions(
            name="restartwindow",
            options={"ordering": ["node", "name"],
                     "permissions": [("change_windows", "Can create and edit restart windows")]},
        ),
        migrations.RunPython(grant_windows_to_restart_operators, migrations.RunPython.noop),
    ]
