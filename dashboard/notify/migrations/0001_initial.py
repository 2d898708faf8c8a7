"""Channels and the notification outbox, adopted from the ``dashboard`` app.

State only: the tables were created by the ``dashboard`` migrations 0001-0004 and keep their
names (``dashboard_channel``, ``dashboard_notification``), columns, indexes and constraints, so an existing database moves
no data. ``dashboard.0005_move_models_to_domain_apps`` removes the models from the
``dashboard`` app's state and moves their content types (and so their permissions) here.
"""

import dashboard.notify.models
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('dashboard', '0004_config_permissions'),
        ('collectors', '0005_mask_engine_secrets'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='Channel',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('name', models.CharField(max_length=100)),
                    ('kind', models.CharField(choices=[('email', 'Email'), ('webhook', 'Webhook')], max_length=16)),
                    ('enabled', models.BooleanField(default=True)),
                    ('config', models.JSONField(blank=True, default=dict)),
                    ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                    ('last_success_at', models.DateTimeField(blank=True, null=True)),
                    ('last_error', models.TextField(blank=True)),
                    ('last_error_at', models.DateTimeField(blank=True, null=True)),
                    ('disabled_reason', models.TextField(blank=True)),
                    ('sending_until', models.DateTimeField(blank=True, editable=False, null=True)),
                    ('failures_in_a_row', models.PositiveIntegerField(default=0, editable=False)),
                    ('paused_until', models.DateTimeField(blank=True, editable=False, null=True)),
                    ('node', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='notification_channels', to='collectors.node')),
                ],
                options={
                    'db_table': 'dashboard_channel',
                    'ordering': ['name', 'pk'],
                    'permissions': [('change_channels', 'Can create, edit, enable and disable channels')],
                },
            ),
            migrations.CreateModel(
                name='Notification',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('message_id', models.CharField(default=dashboard.notify.models.new_message_id, editable=False, max_length=40, unique=True)),
                    ('kind', models.CharField(choices=[('firing', 'Firing'), ('resolved', 'Resolved'), ('repeat', 'Repeat'), ('updated', 'New incident'), ('test', 'Test')], max_length=16)),
                    ('alert_id', models.BigIntegerField(blank=True, null=True)),
                    ('payload', models.JSONField(default=dict)),
                    ('subject', models.CharField(max_length=255)),
                    ('text', models.TextField()),
                    ('html', models.TextField(blank=True)),
                    ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                    ('next_attempt_at', models.DateTimeField(default=django.utils.timezone.now)),
                    ('attempts', models.PositiveIntegerField(default=0)),
                    ('claimed_at', models.DateTimeField(blank=True, null=True)),
                    ('claimed_by', models.CharField(blank=True, max_length=200)),
                    ('delivered_at', models.DateTimeField(blank=True, null=True)),
                    ('failed_at', models.DateTimeField(blank=True, null=True)),
                    ('last_error', models.TextField(blank=True)),
                    ('channel', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='notifications', to='notify.channel')),
                ],
                options={
                    'db_table': 'dashboard_notification',
                    'ordering': ['-created_at', '-pk'],
                    'indexes': [models.Index(condition=models.Q(('delivered_at__isnull', True), ('failed_at__isnull', True)), fields=['next_attempt_at'], name='notify_open_due_idx'), models.Index(fields=['channel', '-created_at'], name='notify_channel_recent_idx'), models.Index(fields=['alert_id'], name='notify_alert_idx')],
                },
            ),
        ]),
    ]
