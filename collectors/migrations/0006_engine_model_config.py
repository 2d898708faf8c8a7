"""Engine.model_config: the model's config.json, read on the node and stored for the pages."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("collectors", "0005_mask_engine_secrets"),
    ]

    operations = [
        migrations.AddField(
            model_name="engine",
            name="model_config",
            field=models.JSONField(default=dict),
        ),
    ]
