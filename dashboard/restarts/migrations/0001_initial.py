"""Restart windows, restarts and their steps, adopted from the ``dashboard`` app.

State only: the tables were created by the ``dashboard`` migrations 0001-0004 and keep their
names (``dashboard_restartwindow``, ``dashboard_restart``, ``dashboard_restartstep``), columns, indexes and constraints, so an existing database moves
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
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='Restart',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('kind', models.CharField(choices=[('planned', 'Planned'), ('unplanned', 'Unplanned')], max_length=16)),
                    ('status', models.CharField(choices=[('scheduled', 'Scheduled'), ('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('aborted', 'Aborted'), ('interrupted', 'Interrupted'), ('refused', 'Refused'), ('cancelled', 'Cancelled'), ('detected', 'Detected')], max_length=16)),
                    ('requested_at', models.DateTimeField(default=django.utils.timezone.now)),
                    ('reason', models.TextField(blank=True)),
                    ('scheduled_for', models.DateTimeField(blank=True, null=True)),
                    ('expected_drain_seconds', models.PositiveIntegerField(default=0)),
                    ('expected_startup_seconds', models.PositiveIntegerField(default=600)),
                    ('expected_back_by', models.DateTimeField(blank=True, null=True)),
                    ('started_at', models.DateTimeField(blank=True, null=True)),
                    ('finished_at', models.DateTimeField(blank=True, null=True)),
                    ('deadline', models.DateTimeField(blank=True, null=True)),
                    ('phase', models.CharField(blank=True, max_length=32)),
                    ('heartbeat_at', models.DateTimeField(blank=True, null=True)),
                    ('worker', models.CharField(blank=True, max_length=255)),
                    ('outcome', models.TextField(blank=True)),
                    ('startup_seconds', models.FloatField(blank=True, null=True)),
                    ('before', models.JSONField(blank=True, default=dict)),
                    ('after', models.JSONField(blank=True, default=dict)),
                    ('container_state', models.JSONField(blank=True, default=dict)),
                    ('engine', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='restarts', to='collectors.engine')),
                    ('node', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='restarts', to='collectors.node')),
                    ('requested_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ],
                options={
                    'db_table': 'dashboard_restart',
                    'ordering': ['-requested_at'],
                    'permissions': [('run_restarts', 'Can plan and run engine restarts')],
                },
            ),
            migrations.CreateModel(
                name='RestartStep',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('step', models.CharField(max_length=32)),
                    ('started_at', models.DateTimeField()),
                    ('finished_at', models.DateTimeField(blank=True, null=True)),
                    ('ok', models.BooleanField(null=True)),
                    ('message', models.TextField(blank=True)),
                    ('data', models.JSONField(blank=True, default=dict)),
                    ('restart', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='restarts.restart')),
                ],
                options={
                    'db_table': 'dashboard_restartstep',
                    'ordering': ['started_at', 'pk'],
                },
            ),
            migrations.CreateModel(
                name='RestartWindow',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('name', models.CharField(max_length=120)),
                    ('recurrence', models.TextField()),
                    ('time_zone', models.CharField(max_length=64)),
                    ('duration_minutes', models.PositiveIntegerField()),
                    ('enabled', models.BooleanField(default=True)),
                    ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                    ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ('engine', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='restart_windows', to='collectors.engine')),
                    ('node', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='restart_windows', to='collectors.node')),
                ],
                options={
                    'db_table': 'dashboard_restartwindow',
                    'ordering': ['node', 'name'],
                    'permissions': [('change_windows', 'Can create and edit restart windows')],
                },
            ),
            migrations.AddField(
                model_name='restart',
                name='window',
                field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='restarts', to='restarts.restartwindow'),
            ),
            migrations.AddIndex(
                model_name='restart',
                index=models.Index(fields=['node', 'status'], name='restart_node_status'),
            ),
            migrations.AddIndex(
                model_name='restart',
                index=models.Index(fields=['engine', 'status'], name='restart_engine_status'),
            ),
            migrations.AddConstraint(
                model_name='restart',
                constraint=models.UniqueConstraint(condition=models.Q(('status', 'running')), fields=('node',), name='restart_one_running_per_node'),
            ),
            migrations.AddConstraint(
                model_name='restart',
                constraint=models.UniqueConstraint(condition=models.Q(('status__in', ['scheduled', 'running'])), fields=('engine',), name='restart_one_open_per_engine'),
            ),
        ]),
    ]
