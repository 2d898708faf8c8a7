# Delivery limits per channel: one send in flight, and a circuit breaker for slow receivers;
# the "updated" notification kind (a new incident folded into a firing alert).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0002_restarts'),
    ]

    operations = [
        migrations.AddField(
            model_name='channel',
            name='sending_until',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='channel',
            name='failures_in_a_row',
            field=models.PositiveIntegerField(default=0, editable=False),
        ),
        migrations.AddField(
            model_name='channel',
            name='paused_until',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AlterField(
            model_name='notification',
            name='kind',
            field=models.CharField(choices=[('firing', 'Firing'), ('resolved', 'Resolved'), ('repeat', 'Repeat'), ('updated', 'New incident'), ('test', 'Test')], max_length=16),
        ),
    ]
