"""The audit log, adopted from the ``dashboard`` app.

State only: the tables were created by the ``dashboard`` migrations 0001-0004 and keep their
names (``dashboard_auditentry``), columns, indexes and constraints, so an existing database moves
no data. ``dashboard.0005_move_models_to_domain_apps`` removes the models from the
``dashboard`` app's state and moves their content types (and so their permissions) here.
"""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('dashboard', '0004_config_permissions'),
        ('collectors', '0005_mask_engine_secrets'),
        ('restarts', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='AuditEntry',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('at', models.DateTimeField(default=django.utils.timezone.now)),
                    ('actor', models.CharField(blank=True, max_length=120)),
                    ('address', models.GenericIPAddressField(blank=True, null=True)),
                    ('action', models.CharField(max_length=64)),
                    ('allowed', models.BooleanField()),
                    ('outcome', models.TextField(blank=True)),
                    ('details', models.JSONField(blank=True, default=dict)),
                    ('engine', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='collectors.engine')),
                    ('node', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='collectors.node')),
                ],
                options={
                    'db_table': 'dashboard_auditentry',
                    'ordering': ['-at'],
                    'permissions': [('view_audit', 'Can read the audit log'), ('unlock_logins', 'Can see login lockouts and lift them')],
                },
            ),
            migrations.AddField(
                model_name='auditentry',
                name='restart',
                field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='audit', to='restarts.restart'),
            ),
            migrations.AddField(
                model_name='auditentry',
                name='user',
                field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
            ),
            migrations.AddIndex(
                model_name='auditentry',
                index=models.Index(fields=['action', 'at'], name='audit_action_at'),
            ),
            migrations.AddIndex(
                model_name='auditentry',
                index=models.Index(fields=['at'], name='audit_at'),
            ),
        ]),
    ]
