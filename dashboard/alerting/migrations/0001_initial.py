"""Alerts, alert events, silences and rule settings, adopted from the ``dashboard`` app.

State only: the tables were created by the ``dashboard`` migrations 0001-0004 and keep their
names (``dashboard_alert``, ``dashboard_alertevent``, ``dashboard_silence``,
``dashboard_rulesetting``), columns, indexes and constraints, so an existing database moves
no data. ``dashboard.0005_move_models_to_domain_apps`` removes the models from the
``dashboard`` app's state and moves their content types (and so their permissions) here.
"""

import django.db.models.deletion
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
                name='Alert',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('rule', models.CharField(max_length=64)),
                    ('scope', models.CharField(max_length=200)),
                    ('state', models.CharField(choices=[('pending', 'Pending'), ('firing', 'Firing'), ('resolved', 'Resolved')], default='pending', max_length=16)),
                    ('severity', models.CharField(max_length=16)),
                    ('summary', models.CharField(max_length=500)),
                    ('details', models.JSONField(blank=True, default=dict)),
                    ('value', models.FloatField(blank=True, null=True)),
                    ('threshold', models.FloatField()),
                    ('clear', models.FloatField(blank=True, null=True)),
                    ('direction', models.CharField(blank=True, max_length=8)),
                    ('started_at', models.DateTimeField()),
                    ('fired_at', models.DateTimeField(blank=True, null=True)),
                    ('resolved_at', models.DateTimeField(blank=True, null=True)),
                    ('last_evaluated_at', models.DateTimeField()),
                    ('last_evaluation', models.CharField(blank=True, max_length=16)),
                    ('last_notified_at', models.DateTimeField(blank=True, null=True)),
                    ('notify_count', models.PositiveIntegerField(default=0)),
                    ('resolve_reason', models.CharField(blank=True, choices=[('cleared', 'value back past the clear edge'), ('never fired', 'cleared while pending, never fired'), ('no longer applies', 'no longer applies (scope gone)'), ('rule disabled', 'rule disabled')], max_length=32)),
                    ('engine', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='alerts', to='collectors.engine')),
                    ('node', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alerts', to='collectors.node')),
                ],
                options={
                    'db_table': 'dashboard_alert',
                    'ordering': ['-started_at', '-id'],
                },
            ),
            migrations.CreateModel(
                name='AlertEvent',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('at', models.DateTimeField()),
                    ('from_state', models.CharField(blank=True, max_length=16)),
                    ('to_state', models.CharField(max_length=16)),
                    ('value', models.FloatField(blank=True, null=True)),
                    ('notice', models.CharField(blank=True, max_length=16)),
                    ('message', models.TextField(blank=True)),
                    ('alert', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='events', to='alerting.alert')),
                ],
                options={
                    'db_table': 'dashboard_alertevent',
                    'ordering': ['at', 'id'],
                },
            ),
            migrations.CreateModel(
                name='RuleSetting',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('rule', models.CharField(max_length=64, unique=True)),
                    ('enabled', models.BooleanField(default=True)),
                    ('for_seconds', models.PositiveIntegerField(blank=True, null=True)),
                    ('repeat_seconds', models.PositiveIntegerField(blank=True, null=True)),
                    ('thresholds', models.JSONField(blank=True, default=dict)),
                    ('updated_at', models.DateTimeField(blank=True, null=True)),
                    ('updated_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ],
                options={
                    'db_table': 'dashboard_rulesetting',
                    'permissions': [('change_rules', 'Can change alert rule settings')],
                },
            ),
            migrations.CreateModel(
                name='Silence',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('rule', models.CharField(blank=True, max_length=64)),
                    ('starts_at', models.DateTimeField()),
                    ('ends_at', models.DateTimeField()),
                    ('reason', models.TextField()),
                    ('created_at', models.DateTimeField()),
                    ('expired_early', models.BooleanField(default=False)),
                    ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ('engine', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='silences', to='collectors.engine')),
                    ('expired_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ('node', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='silences', to='collectors.node')),
                ],
                options={
                    'db_table': 'dashboard_silence',
                    'ordering': ['-ends_at', '-id'],
                    'permissions': [('change_silences', 'Can create and expire silences')],
                },
            ),
            migrations.AddIndex(
                model_name='alert',
                index=models.Index(fields=['node', 'state'], name='alert_node_state'),
            ),
            migrations.AddConstraint(
                model_name='alert',
                constraint=models.UniqueConstraint(condition=models.Q(('state__in', ('pending', 'firing'))), fields=('scope',), name='alert_one_open_per_scope'),
            ),
            migrations.AddIndex(
                model_name='silence',
                index=models.Index(fields=['ends_at'], name='silence_ends_at'),
            ),
        ]),
    ]
