"""Roll-ups in tiers (minute, ten minutes, hour) for host and engine series, and an index for
the last failed collection.

Existing per-minute roll-ups become the minute tier and seed the coarser tiers, so long charts
keep their history; the roll-up watermark is reset so the raw engine samples still kept are
rolled up too (the next roll-up runs catch up in bounded chunks).
"""

from collections import defaultdict
from datetime import UTC, datetime

import django.db.models.deletion
from django.db import migrations, models

COARSER = (600, 3600)


def _floor(moment, seconds):
    stamp = moment.timestamp()
    return datetime.fromtimestamp(stamp - stamp % seconds, UTC)


def seed_coarse_tiers(apps, schema_editor):
    Node = apps.get_model("collectors", "Node")
    Rollup = apps.get_model("collectors", "Rollup")
    for node in Node.objects.all():
        minutes = Rollup.objects.filter(node=node, resolution=60).values_list(
            "metric", "start", "min", "max", "mean", "count")
        buckets = defaultdict(lambda: [float("inf"), float("-inf"), 0.0, 0])
        for metric, start, lo, hi, mean, count in minutes.iterator(chunk_size=5000):
            for seconds in COARSER:
                bucket = buckets[(seconds, metric, _floor(start, seconds))]
                bucket[0], bucket[1] = min(bucket[0], lo), max(bucket[1], hi)
                bucket[2] += mean * count
                bucket[3] += count
        Rollup.objects.bulk_create([
            Rollup(node=node, resolution=seconds, metric=metric, start=start, min=lo, max=hi,
                   mean=total / count, count=count)
            for (seconds, metric, start), (lo, hi, total, count) in buckets.items()
        ], batch_size=2000)
        node.rolled_up_until = None
        node.save(update_fields=["rolled_up_until"])


class Migration(migrations.Migration):

    dependencies = [
        ("collectors", "0003_engine_env_managed"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="rollup", name="rollup_unique_minute"),
        migrations.RenameField(model_name="rollup", old_name="minute", new_name="start"),
        migrations.AddField(
            model_name="rollup",
            name="resolution",
            field=models.PositiveIntegerField(default=60),
        ),
        migrations.AddIndex(
            model_name="rollup",
            index=models.Index(fields=["node", "metric", "resolution", "start", "min", "max"],
                               name="rollup_bucket_covering"),
        ),
        migrations.CreateModel(
            name="EngineRollup",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("metric", models.PositiveSmallIntegerField(choices=[
                    (1, "Requests running"), (2, "Requests waiting"), (3, "KV cache usage (0–1)"),
                    (4, "Prefill tok/s"), (5, "Decode tok/s"), (6, "TTFT p50 (s)"),
                    (7, "TTFT p95 (s)"), (8, "Inter-token latency p50 (s)"),
                    (9, "Inter-token latency p95 (s)"), (10, "Prefix-cache hit rate"),
                    (11, "Speculative acceptance rate"), (12, "Preemptions/s"),
                    (13, "Container memory (cgroup)"), (14, "GPU memory (NVML)")])),
                ("resolution", models.PositiveIntegerField(default=60)),
                ("start", models.DateTimeField()),
                ("min", models.FloatField()),
                ("max", models.FloatField()),
                ("mean", models.FloatField()),
                ("count", models.PositiveIntegerField()),
                ("engine", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                             related_name="+", to="collectors.engine")),
            ],
            options={
                "indexes": [models.Index(
                    fields=["engine", "metric", "resolution", "start", "min", "max"],
                    name="erollup_bucket_covering")],
            },
        ),
        migrations.AddIndex(
            model_name="collection",
            index=models.Index(condition=models.Q(("ok", False)), fields=["node", "at"],
                               name="collection_failed_node_at"),
        ),
        migrations.RunPython(seed_coarse_tiers, migrations.RunPython.noop),
    ]
