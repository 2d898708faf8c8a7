"""The table of model architectures (collectors.models.ModelArchitecture): its seed rows give
the figures the planner's former Python table gave, entry by entry; an admin adds and corrects
models through the real Django admin, a config.json the planner cannot read is refused in words
and never saved, and the planner finds what was saved by repo id, alias or local path."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from collectors.modelarch import (
    FULL,
    SLIDING,
    TABLE_IN_ADMIN,
    Architecture,
    ArchitectureUnknown,
    LayerAttention,
    architecture_for,
    architecture_from_table_entry,
    seeded_architecture,
)
from collectors.models import ModelArchitecture
from tests.migrating import migrate, newest

SEED_FILE = Path(__file__).resolve().parent.parent / "collectors" / "seeds" \
    / "model_architectures.json"
ADD_URL = "/admin/collectors/modelarchitecture/add/"
LIST_URL = "/admin/collectors/modelarchitecture/"

# --- the expected figures: the planner's Python table as it was before the database table ------


def _alternating(num_layers, kv_heads, head_dim, window):
    sliding = LayerAttention(SLIDING, kv_heads, head_dim, head_dim, window)
    full = LayerAttention(FULL, kv_heads, head_dim, head_dim)
    return tuple(sliding if index % 2 == 0 else full for index in range(num_layers))


def _uniform(num_layers, kv_heads, head_dim):
    return (LayerAttention(FULL, kv_heads, head_dim, head_dim),) * num_layers


def _gemma4_26b_a4b():
    sliding = LayerAttention(SLIDING, 8, 256, 256, 1024)
    full = LayerAttention(FULL, 2, 512, 512)
    return ((sliding,) * 5 + (full,)) * 5


_PUBLISHED = "from the published config.json of {repo}"
_GEMMA4_SOURCE = (
    "the attention layers vLLM 0.19-0.33 builds for nvidia/Gemma-4-26B-A4B-NVFP4 (gemma4.py: "
    "30 layers, 5 sliding-window of 8 KV heads x 256 then 1 full of 2 x 512, five times; "
    "window 1024; 131,072 positions); its hidden sizes are not seeded"
)
_MAMBA_HYBRID = (
    "a hybrid Mamba-2 / attention model (NemotronH): vLLM keeps one fixed-size state per "
    "request for each Mamba layer, not per token, and sizes the attention blocks to that "
    "state's page, which this planner does not model; its layer pattern is not seeded, so read "
    "its config.json for the attention layers"
)

SEEDED: dict[str, Architecture | str] = {
    "nvidia/gemma-4-26b-a4b-nvfp4": Architecture(
        model_type="gemma4_text", layers=_gemma4_26b_a4b(), source=_GEMMA4_SOURCE,
        dtype="bfloat16", max_position_embeddings=131072, quant_method="modelopt",
        quant_algo="nvfp4", kv_quant_known=False, min_vllm="0.19.0",
        architectures=("Gemma4ForConditionalGeneration",),
        gaps=("hidden sizes (for the prefill estimate and weights from parameters)",
              "whether the checkpoint declares an fp8 KV cache")),
    "openai/gpt-oss-120b": Architecture(
        model_type="gpt_oss", layers=_alternating(36, 8, 64, 128),
        source=_PUBLISHED.format(repo="openai/gpt-oss-120b"), dtype="bfloat16",
        hidden_size=2880, num_attention_heads=64, intermediate_size=2880,
        moe_intermediate_size=2880, num_experts=128,
        experts_per_token=4, vocab_size=201088, max_position_embeddings=131072,
        quant_method="mxfp4", min_vllm="0.10.1"),
    "openai/gpt-oss-20b": Architecture(
        model_type="gpt_oss", layers=_alternating(24, 8, 64, 128),
        source=_PUBLISHED.format(repo="openai/gpt-oss-20b"), dtype="bfloat16",
        hidden_size=2880, num_attention_heads=64, intermediate_size=2880,
        moe_intermediate_size=2880, num_experts=32,
        experts_per_token=4, vocab_size=201088, max_position_embeddings=131072,
        quant_method="mxfp4", min_vllm="0.10.1"),
    "meta-llama/llama-3.1-8b-instruct": Architecture(
        model_type="llama", layers=_uniform(32, 8, 128),
        source=_PUBLISHED.format(repo="meta-llama/Llama-3.1-8B-Instruct"), dtype="bfloat16",
        hidden_size=4096, num_attention_heads=32, intermediate_size=14336, vocab_size=128256,
        max_position_embeddings=131072),
    "meta-llama/llama-3.1-70b-instruct": Architecture(
        model_type="llama", layers=_uniform(80, 8, 128),
        source=_PUBLISHED.format(repo="meta-llama/Llama-3.1-70B-Instruct"), dtype="bfloat16",
        hidden_size=8192, num_attention_heads=64, intermediate_size=28672, vocab_size=128256,
        max_position_embeddings=131072),
    "qwen/qwen3-30b-a3b": Architecture(
        model_type="qwen3_moe", layers=_uniform(48, 4, 128),
        source=_PUBLISHED.format(repo="Qwen/Qwen3-30B-A3B"), dtype="bfloat16",
        hidden_size=2048, num_attention_heads=32, intermediate_size=6144,
        moe_intermediate_size=768, num_experts=128, experts_per_token=8, vocab_size=151936,
        max_position_embeddings=40960),
    "nvidia/nvidia-nemotron-nano-9b-v2": _MAMBA_HYBRID,
    "nvidia/nvidia-nemotron-nano-12b-v2": _MAMBA_HYBRID,
    "nvidia/nemotron-3-super-120b-a12b-nvfp4": _MAMBA_HYBRID,
}
SEEDED_ALIASES = {
    "google/gemma-4-26b-a4b-it": "nvidia/gemma-4-26b-a4b-nvfp4",
    "redhatai/gemma-4-26b-a4b-it-nvfp4": "nvidia/gemma-4-26b-a4b-nvfp4",
    "redhatai/gemma-4-26b-a4b-it-fp8-dynamic": "nvidia/gemma-4-26b-a4b-nvfp4",
    "meta-llama/llama-3.1-8b": "meta-llama/llama-3.1-8b-instruct",
    "meta-llama/llama-3.1-70b": "meta-llama/llama-3.1-70b-instruct",
    "meta-llama/llama-3.3-70b-instruct": "meta-llama/llama-3.1-70b-instruct",
}


def same_figures(found: Architecture, expected: Architecture) -> None:
    """Every field of the former entry, compared one by one so a failure names the field. The
    former entries named no ``architectures`` where the published config.json does (Llama,
    Qwen, gpt-oss); only the release gate read from them, ``min_vllm``, is then compared."""
    for field in fields(Architecture):
        if field.name == "architectures" and not expected.architectures:
            continue
        assert getattr(found, field.name) == getattr(expected, field.name), field.name


def seed_entries() -> list[dict]:
    return json.loads(SEED_FILE.read_text())["entries"]


def as_row(entry: dict) -> SimpleNamespace:
    return SimpleNamespace(repo_id=entry["repo_id"], config=entry.get("config"),
                           hf_quant_config=entry.get("hf_quant_config"),
                           unknown_reason=entry.get("unknown_reason", ""),
                           source=entry["source"])


# --- the seeds -----------------------------------------------------------------------------------


def test_the_seed_file_holds_every_former_entry_and_alias():
    entries = seed_entries()
    assert [entry["repo_id"] for entry in entries] == list(SEEDED)
    aliases = {alias: entry["repo_id"] for entry in entries for alias in entry["aliases"]}
    assert aliases == SEEDED_ALIASES


@pytest.mark.parametrize("repo_id", list(SEEDED))
def test_each_seed_file_entry_gives_the_former_figures(repo_id):
    entry = next(entry for entry in seed_entries() if entry["repo_id"] == repo_id)
    expected = SEEDED[repo_id]
    if isinstance(expected, str):
        assert "config" not in entry
        with pytest.raises(ArchitectureUnknown) as raised:
            architecture_from_table_entry(as_row(entry), repo_id)
        assert str(raised.value) == f"{repo_id} is {expected}"
    else:
        same_figures(architecture_from_table_entry(as_row(entry)), expected)


@pytest.mark.django_db
@pytest.mark.parametrize("name", [*SEEDED, *SEEDED_ALIASES])
def test_each_migrated_seed_row_gives_the_former_figures(name):
    """The rows the data migration wrote, found as the planner finds them."""
    expected = SEEDED[SEEDED_ALIASES.get(name, name)]
    if isinstance(expected, str):
        with pytest.raises(ArchitectureUnknown) as raised:
            seeded_architecture(name)
        assert str(raised.value) == f"{name} is {expected}"
    else:
        same_figures(seeded_architecture(name), expected)


@pytest.mark.django_db
def test_the_seed_rows_are_untouched_seeds_changed_by_no_one():
    rows = ModelArchitecture.objects.all()
    assert sorted(row.repo_id for row in rows) == sorted(SEEDED)
    assert {(row.untouched_seed, row.changed_by_id) for row in rows} == {(True, None)}


@pytest.mark.django_db
def test_gemma_keeps_its_30_layers_and_its_kv_quantisation_not_known():
    arch = seeded_architecture("nvidia/Gemma-4-26B-A4B-NVFP4")
    assert arch.layers == (((LayerAttention(SLIDING, 8, 256, 256, 1024),) * 5
                            + (LayerAttention(FULL, 2, 512, 512),)) * 5)
    assert arch.kv_quant_known is False and arch.kv_cache_quant_algo is None
    assert (arch.hidden_size, arch.num_attention_heads, arch.intermediate_size) == \
        (None, None, None)


# --- an admin adds and corrects models -----------------------------------------------------------

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 2048,
    "intermediate_size": 8192, "vocab_size": 128256, "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def form(**change) -> dict[str, str]:
    data = {"repo_id": "Acme/Tiny-1B", "aliases": "acme/tiny-1b-instruct\nACME/Tiny-1B-FP8",
            "config": json.dumps(TINY_CONFIG, indent=2), "hf_quant_config": "",
            "unknown_reason": "", "source": "from the published config.json of Acme/Tiny-1B"}
    return {**data, **change}


@pytest.mark.django_db
def test_an_admin_adds_a_model_and_the_planner_then_finds_it(admin_client):
    with pytest.raises(ArchitectureUnknown, match=f"add it under {TABLE_IN_ADMIN}"):
        architecture_for("acme/tiny-1b")
    assert admin_client.get(ADD_URL).status_code == 200
    response = admin_client.post(ADD_URL, form())
    assert response.status_code == 302, response.content.decode()

    row = ModelArchitecture.objects.get(repo_id="acme/tiny-1b")
    assert row.alias_list == ["acme/tiny-1b-instruct", "acme/tiny-1b-fp8"]
    assert (row.changed_by.username, row.untouched_seed) == ("admin", False)
    arch = architecture_for("Acme/Tiny-1B")
    assert arch.layers == (LayerAttention(FULL, 8, 64, 64),) * 16
    assert arch.source == "from the published config.json of Acme/Tiny-1B"
    assert arch.hidden_size == 2048 and arch.dtype == "bfloat16"


@pytest.mark.django_db
@pytest.mark.parametrize("name", [
    "acme/tiny-1b-instruct", "Acme/Tiny-1B-FP8", "/models/acme/Tiny-1B/",
    "/srv/models/Acme/tiny-1b-instruct", "models--acme--tiny-1b",
])
def test_an_alias_and_a_local_path_resolve(admin_client, name):
    assert admin_client.post(ADD_URL, form()).status_code == 302
    assert len(seeded_architecture(name).layers) == 16


@pytest.mark.django_db
@pytest.mark.parametrize(("change", "field", "message"), [
    ({"config": json.dumps({**TINY_CONFIG, "num_hidden_layers": None})}, "config",
     "config.json: num_hidden_layers is missing"),
    ({"config": json.dumps({key: value for key, value in TINY_CONFIG.items()
                            if key not in ("num_attention_heads", "num_key_value_heads")})},
     "config", "config.json: the attention&#x27;s KV heads or head size are missing"),
    ({"config": '{"model_type": "llama",'}, "config", "config.json is not valid JSON."),
    ({"config": '["not", "an", "object"]'}, "config", "config.json is not a JSON object"),
    ({"config": ""}, "config",
     "give the model&#x27;s config.json, or say why it cannot be planned"),
    ({"unknown_reason": "a hybrid model"}, "unknown_reason",
     "give either the model&#x27;s config.json or why it cannot be planned, not both"),
    ({"hf_quant_config": "[1]"}, "hf_quant_config", "hf_quant_config.json is not a JSON object"),
    ({"aliases": "google/gemma-4-26b-a4b-it"}, "aliases",
     "already another model&#x27;s name: google/gemma-4-26b-a4b-it (of "
     "nvidia/gemma-4-26b-a4b-nvfp4)"),
    ({"repo_id": "Meta-Llama/Llama-3.1-8B"}, "repo_id",
     "meta-llama/llama-3.1-8b is an alias of meta-llama/llama-3.1-8b-instruct"),
    ({"repo_id": "OpenAI/gpt-oss-20b"}, "repo_id", "openai/gpt-oss-20b is already in the table"),
])
def test_a_row_the_planner_cannot_read_is_refused_in_words_and_not_saved(
        admin_client, change, field, message):
    before = list(ModelArchitecture.objects.values_list("pk", "repo_id", "source", "config"))
    response = admin_client.post(ADD_URL, form(**change))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field], errors
    assert message in response.content.decode()
    after = list(ModelArchitecture.objects.values_list("pk", "repo_id", "source", "config"))
    assert after == before


@pytest.mark.django_db
def test_a_model_that_cannot_be_planned_raises_with_its_reason(admin_client):
    response = admin_client.post(ADD_URL, form(
        repo_id="acme/hybrid-9b", aliases="", config="",
        unknown_reason="a hybrid Mamba-2 / attention model whose state the planner cannot size",
        source="its model card"))
    assert response.status_code == 302
    with pytest.raises(ArchitectureUnknown) as raised:
        architecture_for("/models/Acme/Hybrid-9B")
    assert str(raised.value) == ("/models/Acme/Hybrid-9B is a hybrid Mamba-2 / attention model "
                                 "whose state the planner cannot size")
    with pytest.raises(ArchitectureUnknown, match="one fixed-size state per request"):
        architecture_for("nvidia/NVIDIA-Nemotron-Nano-9B-v2")


@pytest.mark.django_db
def test_correcting_a_seed_records_who_and_it_is_no_longer_an_untouched_seed(admin_client):
    gemma = ModelArchitecture.objects.get(repo_id="nvidia/gemma-4-26b-a4b-nvfp4")
    page = admin_client.get(f"{LIST_URL}{gemma.pk}/change/")
    assert page.status_code == 200
    shown = page.context["adminform"].form["config"].value()
    assert json.loads(shown) == gemma.config and "\n  " in shown  # indented for reading

    config = json.loads(json.dumps(gemma.config))
    config["text_config"]["num_attention_heads"] = 16
    response = admin_client.post(f"{LIST_URL}{gemma.pk}/change/", {
        "repo_id": gemma.repo_id, "aliases": gemma.aliases, "config": json.dumps(config),
        "hf_quant_config": "", "unknown_reason": "", "source": gemma.source + "; heads added"})
    assert response.status_code == 302, response.content.decode()
    gemma.refresh_from_db()
    assert (gemma.untouched_seed, gemma.changed_by.username) == (False, "admin")
    arch = seeded_architecture("google/gemma-4-26b-a4b-it")
    assert arch.num_attention_heads == 16 and arch.source.endswith("; heads added")
    assert len(arch.layers) == 30


@pytest.mark.django_db
def test_the_list_names_each_entry_and_finds_a_model_by_its_alias(admin_client):
    page = admin_client.get(LIST_URL, {"q": "redhatai/gemma-4-26b-a4b-it-nvfp4"})
    assert page.status_code == 200
    found = [row.repo_id for row in page.context["cl"].result_list]
    assert found == ["nvidia/gemma-4-26b-a4b-nvfp4"]
    text = page.content.decode()
    assert "config.json" in text and "seed, untouched" in text
    every = admin_client.get(LIST_URL, {"q": "nemotron"})
    assert "cannot be planned" in every.content.decode()
    assert len(every.context["cl"].result_list) == 3


# --- the data migration --------------------------------------------------------------------------


@pytest.fixture
def migrations_undone():
    """The test database taken back by the test, and to the newest migrations afterwards."""
    yield
    migrate(newest())


# Migrates the test database back and forth: seconds, not milliseconds.
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_seed_migration_reverses_to_no_seed_rows_and_keeps_an_admins(migrations_undone):
    seeded = migrate([("collectors", "0012_seed_model_architectures")])
    rows = seeded.get_model("collectors", "ModelArchitecture").objects
    assert rows.filter(untouched_seed=True).count() == len(SEEDED)
    rows.filter(repo_id="openai/gpt-oss-20b").update(untouched_seed=False, source="an admin's")
    rows.create(repo_id="acme/tiny-1b", config=TINY_CONFIG, source="an admin's")

    before = migrate([("collectors", "0011_model_architectures")])
    kept = before.get_model("collectors", "ModelArchitecture").objects
    assert sorted(kept.values_list("repo_id", flat=True)) == ["acme/tiny-1b", "openai/gpt-oss-20b"]

    again = migrate([("collectors", "0012_seed_model_architectures")])
    rows = again.get_model("collectors", "ModelArchitecture").objects
    assert rows.count() == len(SEEDED) + 1
    assert rows.get(repo_id="openai/gpt-oss-20b").source == "an admin's"  # not overwritten


def test_the_gemma_seed_is_a_config_json_the_planner_reads_like_any_other():
    """No Python stands in for a seed: Gemma's entry is a config.json whose only non-Hugging
    Face key lists what its source does not give."""
    gemma = seed_entries()[0]["config"]
    assert set(gemma) == {"architectures", "model_type", "text_config", "quantization_config",
                          "sparkops_unknown"}
    found = architecture_from_table_entry(as_row(seed_entries()[0]))
    without = {key: value for key, value in gemma.items() if key != "sparkops_unknown"}
    plain = architecture_from_table_entry(as_row({**seed_entries()[0], "config": without}))
    assert replace(plain, kv_quant_known=False, gaps=found.gaps) == found
