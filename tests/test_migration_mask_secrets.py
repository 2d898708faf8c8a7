"""Migration 0005 masks the secrets engine rows stored before masking covered them."""

from __future__ import annotations

import pytest

from tests.migrating import migrate, newest

BEFORE = [("collectors", "0004_rollup_tiers")]
AFTER = [("collectors", "0005_mask_engine_secrets")]
API_KEY = "sk-stored-before-1a2b3c4d5e6f"
MASK = "••••••"


@pytest.fixture
def migrations_undone():
    """The test database taken back before 0005, and to the newest migrations afterwards."""
    yield
    migrate(newest())


# Migrates the whole test database back and forth: seconds, not milliseconds.
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_rows_holding_secrets_are_masked_and_the_rest_kept(migrations_undone):
    old = migrate(BEFORE)
    node = old.get_model("collectors", "Node").objects.create(name="spark-old")
    engine_model = old.get_model("collectors", "Engine")
    leaky = engine_model.objects.create(
        node_id=node.pk, name="leaky", container_id="a" * 64, container_state="running",
        command=["vllm", "serve", "google/gemma", "--api-key", API_KEY,
                 "--max-num-batched-tokens", "8192"],
        env={"DB_PASS": "hunter2", "DATABASE_URL": "postgresql://u:pw-in-url@db/ops",
             "VLLM_MAX_TOKENS": "4096"},
        labels={"sparkops.url": "http://u:label-pw@10.0.0.5:8000"},
        config={"model": "google/gemma", "max_num_batched_tokens": 8192,
                "all_flags": {"api-key": API_KEY, "max-num-batched-tokens": "8192"},
                "unknown_flags": {"api-key": API_KEY}},
        startup={"phase": "ready", "non_default_args": {"api_key": [API_KEY], "model": "m"}},
        last_scrape_error="invalid URL: 'http://u:scrape-pw@host/metrics'",
    )
    clean = engine_model.objects.create(
        node_id=node.pk, name="clean", container_id="b" * 64, container_state="running",
        command=["vllm", "serve", "m"], env={"HF_HOME": "/models"}, config={"model": "m"})

    new = migrate(AFTER)
    engines = new.get_model("collectors", "Engine").objects
    leaky, clean_after = engines.get(pk=leaky.pk), engines.get(pk=clean.pk)

    everything = repr([leaky.command, leaky.env, leaky.labels, leaky.config, leaky.startup,
                       leaky.last_scrape_error])
    for secret in (API_KEY, "hunter2", "pw-in-url", "label-pw", "scrape-pw"):
        assert secret not in everything
    assert leaky.command == ["vllm", "serve", "google/gemma", "--api-key", MASK,
                             "--max-num-batched-tokens", "8192"]
    assert leaky.env == {"DB_PASS": MASK, "DATABASE_URL": f"postgresql://u:{MASK}@db/ops",
                         "VLLM_MAX_TOKENS": "4096"}
    assert leaky.config["max_num_batched_tokens"] == 8192
    assert leaky.config["all_flags"] == {"api-key": MASK, "max-num-batched-tokens": "8192"}
    assert leaky.startup == {"phase": "ready", "non_default_args": {"api_key": [MASK],
                                                                    "model": "m"}}
    assert (clean_after.command, clean_after.env, clean_after.config) == (
        ["vllm", "serve", "m"], {"HF_HOME": "/models"}, {"model": "m"})
