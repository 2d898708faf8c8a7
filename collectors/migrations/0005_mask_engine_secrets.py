"""Mask the secrets engine rows already hold.

Engines discovered before masking covered command lines, URLs and more names stored the launch
command (``--api-key sk-…``), environment values such as ``DB_PASS`` and ``DATABASE_URL``
credentials, labels, the parsed flags, the arguments vLLM logged at startup and refusal or scrape
reasons quoting them, all readable by every signed-in user. Each is rewritten in the masked form
collection now stores (``collectors.redaction``); masking is idempotent, so rows already masked
are left as they are. Not reversible: the secrets are not kept anywhere.
"""

from django.db import migrations

from collectors.redaction import mask_command, mask_data, mask_env, mask_text

_FIELDS = ("command", "env", "labels", "config", "startup", "config_error", "findings",
           "last_scrape_error")


def _masked(engine) -> dict:
    startup = dict(engine.startup or {})
    if startup.get("non_default_args") is not None:
        startup["non_default_args"] = mask_data(startup["non_default_args"])
    if startup.get("engine_config"):
        startup["engine_config"] = mask_data(startup["engine_config"])
    return {
        "command": mask_command([str(word) for word in engine.command or []]),
        "env": mask_env(engine.env or {}),
        "labels": mask_env(engine.labels or {}),
        "config": mask_data(engine.config or {}),
        "startup": startup,
        "config_error": mask_text(engine.config_error or ""),
        "findings": mask_data(engine.findings or []),
        "last_scrape_error": mask_text(engine.last_scrape_error or ""),
    }


def mask_engine_secrets(apps, schema_editor) -> None:
    engine_model = apps.get_model("collectors", "Engine")
    for engine in engine_model.objects.only("pk", *_FIELDS).iterator(chunk_size=200):
        masked = _masked(engine)
        changed = [name for name, value in masked.items() if getattr(engine, name) != value]
        if changed:
            for name in changed:
                setattr(engine, name, masked[name])
            engine.save(update_fields=changed)


class Migration(migrations.Migration):
    dependencies = [("collectors", "0004_rollup_tiers")]

    operations = [migrations.RunPython(mask_engine_secrets, migrations.RunPython.noop)]
