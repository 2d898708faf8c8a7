"""A model's architecture for the KV planner: read from config.json (directly, or inside an
engine's container through /proc/<pid>/root), or from the table of model architectures (its
seed rows here; tests/test_model_architecture_table.py covers the table and its admin); weights
from the checkpoint or the parameter count (collectors.modelarch)."""

from __future__ import annotations

import json
import os

import pytest

from collectors.modelarch import (
    FULL,
    MAMBA,
    SHARED,
    SLIDING,
    UNKNOWN_FIELDS,
    ArchitectureUnknown,
    architecture_for,
    architecture_from_config,
    architecture_from_container,
    architecture_from_model_dir,
    architecture_from_table_entry,
    checkpoint_bytes,
    seeded_architecture,
    weights_from_architecture,
)
from collectors.models import ModelArchitecture

LLAMA_LIKE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4,
    "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
    "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def kinds(arch):
    return [(layer.kind, layer.num_kv_heads, layer.head_dim, layer.window)
            for layer in arch.layers]


def test_a_dense_config_is_full_attention_with_head_dim_from_hidden_size():
    arch = architecture_from_config(LLAMA_LIKE, "config.json")
    assert kinds(arch) == [(FULL, 8, 128, None)] * 4
    assert (arch.dtype, arch.max_position_embeddings, arch.source) == \
        ("bfloat16", 131072, "config.json")


def test_layer_types_name_each_layer():
    config = {**LLAMA_LIKE, "model_type": "gpt_oss", "head_dim": 64, "sliding_window": 128,
              "layer_types": ["sliding_attention", "full_attention"] * 2}
    assert kinds(architecture_from_config(config, "config.json")) == \
        [(SLIDING, 8, 64, 128), (FULL, 8, 64, None)] * 2


def test_gemma_2_alternates_and_older_gemma_3_configs_give_a_pattern():
    gemma2 = {**LLAMA_LIKE, "model_type": "gemma2", "sliding_window": 4096, "head_dim": 256}
    assert [layer.kind for layer in architecture_from_config(gemma2, "c").layers] == \
        [SLIDING, FULL, SLIDING, FULL]
    gemma3 = {"model_type": "gemma3", "text_config": {
        **LLAMA_LIKE, "model_type": "gemma3_text", "num_hidden_layers": 12, "head_dim": 128,
        "num_key_value_heads": 16, "sliding_window": 1024, "sliding_window_pattern": 6}}
    layers = architecture_from_config(gemma3, "c").layers
    assert [layer.kind for layer in layers] == ([SLIDING] * 5 + [FULL]) * 2
    assert layers[0].num_kv_heads == 16 and layers[0].window == 1024


def test_gemma_4_full_layers_use_global_heads_and_shared_layers_hold_no_cache():
    config = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
              "text_config": {
                  "model_type": "gemma4_text", "num_hidden_layers": 8, "num_attention_heads": 16,
                  "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512,
                  "num_global_key_value_heads": 2, "attention_k_eq_v": True,
                  "sliding_window": 1024, "num_kv_shared_layers": 2,
                  "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 2}}
    arch = architecture_from_config(config, "c")
    assert kinds(arch)[:4] == [(SLIDING, 8, 256, 1024)] * 3 + [(FULL, 2, 512, None)]
    assert [layer.kind for layer in arch.layers[6:]] == [SHARED, SHARED]
    assert len(arch.cache_layers) == 6
    assert arch.min_vllm == "0.19.0"


def test_qwen_without_sliding_and_mistral_with_a_global_window():
    qwen = {**LLAMA_LIKE, "model_type": "qwen3", "sliding_window": 32768,
            "use_sliding_window": False}
    assert {layer.kind for layer in architecture_from_config(qwen, "c").layers} == {FULL}
    mistral = {**LLAMA_LIKE, "model_type": "mistral", "sliding_window": 4096}
    assert {layer.kind for layer in architecture_from_config(mistral, "c").layers} == {SLIDING}


def test_rope_scaling_that_stretches_vllms_default_length_is_flagged():
    llama3 = {**LLAMA_LIKE, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    yarn = {**LLAMA_LIKE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 32768}}
    assert not architecture_from_config(llama3, "c").rope_scaled
    assert architecture_from_config(yarn, "c").rope_scaled


def test_hybrid_mamba_layers_are_marked():
    config = {**LLAMA_LIKE, "model_type": "nemotron_h", "num_hidden_layers": 6,
              "hybrid_override_pattern": "M-M*-M"}
    arch = architecture_from_config(config, "c")
    assert [layer.kind for layer in arch.layers if layer.kind != "none"] == \
        [MAMBA, MAMBA, FULL, MAMBA]
    assert arch.has_state_layers


def test_quantisation_and_kv_declarations_are_read():
    modelopt = {**LLAMA_LIKE, "quantization_config": {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}
    arch = architecture_from_config(modelopt, "c")
    assert (arch.quant_method, arch.quant_algo, arch.kv_cache_quant_algo) == \
        ("modelopt", "nvfp4", "fp8")
    compressed = {**LLAMA_LIKE, "quantization_config": {
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}
    assert architecture_from_config(compressed, "c").kv_cache_quant_algo == "fp8"


@pytest.mark.parametrize(("change", "message"), [
    ({"num_hidden_layers": None}, "c: num_hidden_layers is missing"),
    ({"num_hidden_layers": "32"}, "c: num_hidden_layers is not a count ('32')"),
    ({"num_key_value_heads": None, "num_attention_heads": None},
     "the attention's KV heads or head size are missing"),
    ({"layer_types": ["full_attention"]}, "layer_types lists 1 layers but num_hidden_layers is 4"),
    ({"layer_types": ["full_attention", "cross_attention", "full_attention", "full_attention"]},
     "layer type 'cross_attention' is not one the planner knows"),
    ({"kv_lora_rank": 512}, "multi-head latent attention (kv_lora_rank) is not modelled"),
    ({"hybrid_override_pattern": "M*"}, "hybrid_override_pattern has 2 layers"),
])
def test_a_config_that_does_not_say_enough_is_unknown_with_the_field(change, message):
    config = {key: value for key, value in {**LLAMA_LIKE, **change}.items() if value is not None}
    with pytest.raises(ArchitectureUnknown) as raised:
        architecture_from_config(config, "c")
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_non_object_config_is_unknown():
    with pytest.raises(ArchitectureUnknown, match="is not a JSON object"):
        architecture_from_config(["not", "a", "config"], "c")  # type: ignore[arg-type]


def test_an_older_modelopt_exports_separate_quant_file_is_read(tmp_path):
    """ModelOpt 0.29 and older write hf_quant_config.json instead of quantization_config; vLLM
    reads it, but how it then picks the KV dtype under auto is not modelled: said so."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}))
    arch = architecture_from_model_dir(tmp_path)
    assert (arch.quant_method, arch.quant_algo, arch.kv_cache_quant_algo) == \
        ("modelopt", "nvfp4", "fp8")
    assert arch.kv_quant_known is False
    assert architecture_from_model_dir(tmp_path).source == f"{tmp_path}/config.json"
    with pytest.raises(ArchitectureUnknown, match="no readable config.json"):
        architecture_from_model_dir(tmp_path / "missing")


def test_fields_a_table_entry_leaves_unknown_are_gaps_and_an_unknown_kv_quantisation():
    """A table entry's config.json lists under sparkops_unknown what its source does not give:
    each becomes a gap, and a KV quantisation so listed is not known rather than none."""
    config = {**LLAMA_LIKE, "quantization_config": {"quant_method": "modelopt",
                                                    "quant_algo": "NVFP4"}}
    assert architecture_from_config(config, "c").kv_quant_known is True
    listed = {**config, "sparkops_unknown": ["kv_cache_quant_algo"]}
    arch = architecture_from_config(listed, "c")
    assert arch.kv_quant_known is False and arch.kv_cache_quant_algo is None
    assert arch.gaps == (UNKNOWN_FIELDS["kv_cache_quant_algo"],)
    assert kinds(arch) == kinds(architecture_from_config(config, "c"))


@pytest.mark.parametrize(("listed", "message"), [
    ("hidden_size", "c: sparkops_unknown is not a list of field names"),
    (["vocab_size"], "c: sparkops_unknown lists 'vocab_size'; it may list only hidden_size, "
                     "kv_cache_quant_algo"),
    (["hidden_size"], "c: sparkops_unknown lists hidden_size but the config gives it"),
])
def test_a_wrong_list_of_unknown_fields_is_refused(listed, message):
    with pytest.raises(ArchitectureUnknown) as raised:
        architecture_from_config({**LLAMA_LIKE, "sparkops_unknown": listed}, "c")
    assert str(raised.value) == message


# --- the table's seed rows -----------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("name", [
    "nvidia/Gemma-4-26B-A4B-NVFP4", "NVIDIA/gemma-4-26b-a4b-nvfp4",
    "google/gemma-4-26B-A4B-it", "/models/nvidia/Gemma-4-26B-A4B-NVFP4/",
    "models--nvidia--Gemma-4-26B-A4B-NVFP4",
])
def test_seeded_names_are_found_however_they_are_written(name):
    arch = seeded_architecture(name)
    assert len(arch.layers) == 30 and arch.min_vllm == "0.19.0"
    assert "Gemma-4-26B-A4B-NVFP4" in arch.source


@pytest.mark.django_db
def test_the_seeded_gemma_4_layout_is_the_seeds():
    layers = seeded_architecture("nvidia/Gemma-4-26B-A4B-NVFP4").layers
    assert [layer.kind for layer in layers] == ([SLIDING] * 5 + [FULL]) * 5
    assert (layers[0].num_kv_heads, layers[0].head_dim, layers[0].window) == (8, 256, 1024)
    assert (layers[5].num_kv_heads, layers[5].head_dim) == (2, 512)


@pytest.mark.django_db
def test_every_seeded_entry_names_its_source_or_why_it_is_left_unknown():
    rows = list(ModelArchitecture.objects.filter(untouched_seed=True))
    assert len(rows) == 9
    for row in rows:
        assert row.source, row.repo_id
        if row.unknown_reason:
            assert "config.json" in row.unknown_reason, row.repo_id
        else:
            assert architecture_from_table_entry(row).layers, row.repo_id


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "message"), [
    ("someone/unheard-of-7b", "someone/unheard-of-7b is not in the seeded table of model "
                              "architectures and its config.json was not read; add it under "
                              "Admin → Model architectures"),
    ("nvidia/NVIDIA-Nemotron-Nano-9B-v2",
     "one fixed-size state per request for each Mamba layer, not per token"),
    (None, "the engine names no model"),
])
def test_models_the_table_cannot_describe_are_unknown_with_the_reason(name, message):
    with pytest.raises(ArchitectureUnknown) as raised:
        seeded_architecture(name)
    assert message in str(raised.value)


@pytest.mark.django_db
def test_a_read_config_wins_over_the_seed():
    arch = architecture_for("meta-llama/Llama-3.1-8B-Instruct", LLAMA_LIKE, "/m/config.json")
    assert len(arch.layers) == 4 and arch.source == "/m/config.json"
    assert len(architecture_for("meta-llama/Llama-3.1-8B-Instruct").layers) == 32


@pytest.mark.django_db
def test_the_architecture_through_a_containers_root(tmp_path):
    """The config.json the container sees in its Hugging Face cache, through
    /proc/<pid>/root; without one the seed answers, and a model in neither says both."""
    proc = tmp_path / "proc"
    snapshot = (proc / "4242" / "root" / "root" / ".cache" / "huggingface" / "hub"
                / "models--acme--tiny" / "snapshots" / "abc")
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(LLAMA_LIKE))
    arch = architecture_from_container("acme/tiny", {}, 4242, proc)
    assert len(arch.layers) == 4 and arch.quant_method is None
    assert arch.source.endswith("models--acme--tiny/snapshots/abc/config.json in the container")
    (snapshot / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}))
    quantised = architecture_from_container("acme/tiny", {}, 4242, proc)
    assert (quantised.quant_method, quantised.kv_cache_quant_algo) == ("modelopt", "fp8")
    seeded = architecture_from_container("openai/gpt-oss-20b", {}, 4242, proc)
    assert len(seeded.layers) == 24
    with pytest.raises(ArchitectureUnknown) as raised:
        architecture_from_container("acme/other", {}, 4242, proc)
    assert "no readable config.json for acme/other inside the container" in str(raised.value)
    assert "not in the seeded table" in str(raised.value)


# --- weights -------------------------------------------------------------------------------------


def test_checkpoint_bytes_sum_safetensors_through_symlinks(tmp_path):
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "a").write_bytes(b"\0" * 3000)
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    os.symlink(blobs / "a", snapshot / "model-00001-of-00002.safetensors")
    (snapshot / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 1000)
    (snapshot / "config.json").write_text("{}")
    found = checkpoint_bytes(snapshot)
    assert (found.bytes, found.confidence) == (4000, "estimate")
    assert "2 safetensors files" in found.basis


def test_no_checkpoint_is_unknown(tmp_path):
    assert checkpoint_bytes(tmp_path).confidence.startswith("unknown — no *.safetensors")


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "billions", "gib"), [
    ("meta-llama/Llama-3.1-8B-Instruct", 8.0, 15.0),
    ("openai/gpt-oss-120b", 116.8, 60.6),
])
def test_weights_from_the_parameter_count(name, billions, gib):
    """Llama 3.1 8B: 8.0 B parameters in bf16; gpt-oss-120b: 116.8 B, its experts in MXFP4."""
    found = weights_from_architecture(seeded_architecture(name))
    assert f"{billions:.1f} B parameters" in found.basis
    assert found.bytes / 2**30 == pytest.approx(gib, rel=0.02)
    assert found.confidence == "estimate"


@pytest.mark.django_db
def test_weights_without_the_sizes_are_unknown():
    found = weights_from_architecture(seeded_architecture("nvidia/Gemma-4-26B-A4B-NVFP4"))
    assert found.bytes is None and found.confidence.startswith("unknown — hidden_size")
