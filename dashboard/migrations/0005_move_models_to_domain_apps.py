"""Hand the models to the domain apps: ``alerting``, ``notify``, ``restarts`` and ``audit``.

State only: the tables keep their names and rows (each domain app's 0001 describes them with
``db_table`` set), and this migration removes the models from the ``dashboard`` app's state.

Content types move with the models: each row of ``django_content_type`` is relabelled (for
example ``dashboard.restart`` becomes ``restarts.restart``), so the permissions that point to it,
and every user's and group's grant of them, are kept; ``dashboard.run_restarts`` is now
``restarts.run_restarts``. A content type that already exists under the new label (created by a
partial ``migrate`` of a domain app alone) holds no grants from before the move; it gives way to
the old one, which does. Reversible: going back relabels them the other way.
"""

from django.db import migrations

# Model (lower case, as content types store it) -> the app that owns it now.
MOVED = {
    "alert": "alerting",
    "alertevent": "alerting",
    "silence": "alerting",
    "rulesetting": "alerting",
    "channel": "notify",
    "notification": "notify",
    "restartwindow": "restarts",
    "restart": "restarts",
    "restartstep": "restarts",
    "auditentry": "audit",
}
OLD_LABEL = "dashboard"


def _relabel(apps, moves):
    """Relabel content types: ``moves`` is [(model, from label, to label)]."""
    from django.contrib.contenttypes.models import ContentType as LiveContentType

    ContentType = apps.get_model("contenttypes", "ContentType")
    for model, old, new in moves:
        current = ContentType.objects.filter(app_label=old, model=model).first()
        if current is None:
            continue  # a fresh database: post_migrate creates it under the new label later
        # Deleting the newer duplicate also deletes its permissions, which nobody was granted
        # before the move; the old row keeps the ids every grant refers to.
        ContentType.objects.filter(app_label=new, model=model).delete()
        current.app_label = new
        current.save(update_fields=["app_label"])
    # This process may have cached content types by label.
    LiveContentType.objects.clear_cache()


def move_content_types(apps, schema_editor):
    _relabel(apps, [(model, OLD_LABEL, app) for model, app in MOVED.items()])


def restore_content_types(apps, schema_editor):
    _relabel(apps, [(model, app, OLD_LABEL) for model, app in MOVED.items()])


def _forget(name):
    return migrations.DeleteModel(name=name)


class Migration(migrations.Migration):

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("dashboard", "0004_config_permissions"),
        ("alerting", "0001_initial"),
        ("notify", "0001_initial"),
        ("restarts", "0001_initial"),
        ("audit", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            # Models that point to others first, so no state ever holds a dangling relation.
            _forget("AuditEntry"),
            _forget("RestartStep"),
            _forget("Restart"),
            _forget("RestartWindow"),
            _forget("Notification"),
            _forget("Channel"),
            _forget("AlertEvent"),
            _forget("Alert"),
            _forget("Silence"),
            _forget("RuleSetting"),
        ]),
        migrations.RunPython(move_content_types, restore_content_types),
    ]
