"""The bandwidth roofline: inputs from labels, config.json and names; the measured single-stream
decode; the ratio and its plain explanation; config.json read inside the container by the node's
collector; the engine page showing it with its restarts."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from collectors.docker_api import EngineContainer
from collectors.engines import refreshed_model_config
from collectors.modelconfig import read_container_model_config
from collectors.models import Engine, EngineMetric, EngineReading, Metric
from collectors.readings import ENGINE, Sample
from dashboard.restarts.models import Restart
from dashboard.roofline.figure import NOT_MEASURED, engine_roofline
from dashboard.roofline.measure import single_stream_decode
from dashboard.roofline.params import (
    NVFP4_BYTES,
    active_params,
    active_params_from_config,
    bytes_from_config,
    decode_ceiling_tps,
    params_from_name,
    parse_param_count,
)
from tests.stored import host_sample

NEMOTRON = "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4"
GEMMA = "google/gemma-4-26B-A4B-it-NVFP4"
INTERVAL = 5.0
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
            "vocab_size": 128256, "torch_dtype": "bfloat16"}
QWEN3_30B_A3B = {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                 "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936}
MIXTRAL_8X7B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8,
                "num_experts_per_tok": 2, "vocab_size": 32000}


def _engine(node, name: str = "nemotron", model: str = NEMOTRON, **fields) -> Engine:
    return Engine.objects.create(node=node, name=name, container_id=f"{name}-id" + "0" * 40,
                                 container_state="running", phase="ready",
                                 config={"model": model, **fields.pop("config", {})}, **fields)


def _collections(engine: Engine, now: datetime, running: list[int], decode: list[float]) -> None:
    """One collection per 5 s, oldest first, each with a running count and a decode rate."""
    rows = []
    for i, (count, rate) in enumerate(zip(running, decode, strict=True)):
        at = now - timedelta(seconds=INTERVAL * (len(running) - i))
        rows.append(ENGINE.reading(engine, at, [Sample(EngineMetric.REQUESTS_RUNNING, at, count),
                                                Sample(EngineMetric.DECODE_TPS, at, rate)]))
    EngineReading.objects.bulk_create(rows)


def _roofline(engine: Engine, config: dict | None = None) -> dict:
    """The figure, with ``config`` as the config.json the node's collector stored."""
    if config is not None:
        engine.model_config = {"config": config, "source": "/models/x/config.json"}
    return engine_roofline(engine, timezone.now(), bandwidth_gbps=273.0, interval=INTERVAL)


# --- inputs --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "value"), [
    ("12e9", 12e9), ("12B", 12e9), ("3.5b", 3.5e9), ("350M", 350e6), ("12000000000", 12e9),
    ("twelve", None), ("0", None), ("", None),
])
def test_parameter_counts_read_from_labels(text, value):
    assert parse_param_count(text) == value


@pytest.mark.parametrize(("name", "active", "dense"), [
    (NEMOTRON, 12e9, False),
    (GEMMA, 4e9, False),
    ("/models/nemotron-3-super-120b-a12b-nvfp4", 12e9, False),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507-FP8", 3e9, False),
    ("meta-llama/Llama-3.1-8B-Instruct", 8e9, True),
])
def test_active_parameters_from_the_model_name(name, active, dense):
    found = params_from_name(name)

    assert found.value == active and found.source == "model name"
    assert ("dense" in found.detail) is dense


def test_a_name_without_a_size_is_unknown_not_zero():
    found = params_from_name("mistralai/Mixtral-8x7B-Instruct")

    assert found.value is None and "no parameter count" in found.missing


def test_active_parameters_from_config_json_dense_and_moe():
    llama = active_params_from_config(LLAMA_8B).value
    qwen = active_params_from_config(QWEN3_30B_A3B)
    mixtral = active_params_from_config(MIXTRAL_8X7B).value

    # Llama 3.1 8B: 32 × (41.9 M attention + 176.2 M MLP) + 525 M LM head.
    assert llama == pytest.approx(7.50e9, rel=0.01)
    # Qwen3-30B-A3B reads about 3 B per token (8 of 128 experts), not 30 B.
    assert qwen.value == pytest.approx(3.04e9, rel=0.01)
    assert qwen.detail.startswith("MoE, 8 of 128 experts per token")
    # Mixtral 8x7B: two 14336-wide experts per layer.
    assert mixtral == pytest.approx(12.75e9, rel=0.01)


def test_hybrid_configs_are_left_to_the_name():
    hybrid = {**LLAMA_8B, "hybrid_override_pattern": "M-M-M*-"}

    assert "hybrid" in active_params_from_config(hybrid).missing
    found = active_params(Engine(name="x", config={"model": NEMOTRON}), hybrid)
    assert found.value == 12e9 and found.source == "model name"


@pytest.mark.parametrize(("quantization", "width"), [
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, NVFP4_BYTES),
    ({"quant_method": "fp8"}, 1.0),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float"}}}}, NVFP4_BYTES),
    ({"quant_method": "awq", "bits": 4}, 0.53125),
])
def test_bytes_per_parameter_from_the_configs_quantization(quantization, width):
    quantized, _ = bytes_from_config({**LLAMA_8B, "quantization_config": quantization})

    assert quantized.value == width


# --- the figure with the seed's numbers ----------------------------------------------------------

def test_nemotron_nvfp4_ceiling_and_the_measured_ratio(node):
    engine = _engine(node)
    now = timezone.now()
    # One stream at 22.7–23.7 tok/s (the seed); a moment with three requests is not single-stream.
    _collections(engine, now, running=[1, 1, 1, 1, 3, 1, 1],
                 decode=[23.1, 22.7, 23.0, 23.7, 66.0, 23.3, 22.9])

    roofline = _roofline(engine)

    assert roofline["bytes_per_param"]["value"] == NVFP4_BYTES
    assert roofline["bytes_per_token"] == pytest.approx(6.75e9)
    assert 40 <= roofline["ceiling_tps"] <= 45
    # The first sample has no predecessor and the one after the busy moment follows a 3: out.
    assert roofline["measured_samples"] == 4
    assert roofline["measured_tps"] == pytest.approx(22.95)  # median of 22.7, 23.0, 23.7, 22.9
    assert roofline["ratio"] == pytest.approx(0.57, abs=0.01)
    assert roofline["verdict"] == "fair" and roofline["explanations"] == []
    assert roofline["ceiling_text"] == "40.4 tok/s"
    assert roofline["ratio_text"] == "0.57"


def test_decode_ceiling_is_bandwidth_over_bytes_per_token():
    assert decode_ceiling_tps(273.0, 4e9 * NVFP4_BYTES) == pytest.approx(121.3, abs=0.1)
    assert decode_ceiling_tps(273.0, None) is None


def test_labels_set_by_an_admin_win(node):
    engine = _engine(node, model="openai/gpt-oss-120b",
                     labels={"sparkops.active-params": "5.1e9", "sparkops.bytes-per-param": "0.53"})

    roofline = _roofline(engine, LLAMA_8B)

    assert roofline["active_params"]["value"] == 5.1e9
    assert roofline["active_params"]["source"] == "label sparkops.active-params"
    assert roofline["bytes_per_param"]["value"] == 0.53


def test_unknown_inputs_say_what_is_missing_never_zero(node):
    engine = _engine(node, model="meta-llama/Llama-3.1-8B-Instruct")

    roofline = _roofline(engine)

    assert roofline["active_params"]["value"] == 8e9
    assert roofline["ceiling_tps"] is None and roofline["ratio"] is None
    assert roofline["verdict"] == "unknown" and roofline["ceiling_text"] == "unknown"
    assert any("sparkops.bytes-per-param" in text for text in roofline["missing"])
    assert roofline["measured_text"] == NOT_MEASURED

    with_config = _roofline(engine, LLAMA_8B)  # the config's dtype: BF16
    assert with_config["bytes_per_param"]["source"] == "config.json"
    assert with_config["ceiling_tps"] == pytest.approx(273e9 / (7.50e9 * 2), rel=0.01)
    assert with_config["kv_bytes_per_context_token"] == 2 * 32 * 8 * 128 * 2


def test_a_kind_without_token_counters_is_not_measurable_rather_than_not_yet(node):
    """Ollama keeps no token counters: its decode speed will never be measured, and the page
    says so with the reason instead of promising a measurement."""
    engine = _engine(node, model="meta-llama/Llama-3.1-8B-Instruct")
    engine.metrics = {"unknown": {"rates": "Ollama has no /metrics: it keeps no token counters"}}

    roofline = _roofline(engine)

    assert roofline["measured_text"] == ("not measurable: Ollama has no /metrics: it keeps no "
                                         "token counters")
    assert NOT_MEASURED not in roofline["missing"]


def test_a_lone_request_still_prefilling_is_not_a_decode_measurement(node):
    engine = _engine(node)
    now = timezone.now()
    _collections(engine, now, running=[1, 1, 2, 2], decode=[0.0, 0.0, 45.0, 46.0])

    assert single_stream_decode(engine, now, INTERVAL).tps is None


# --- explanations --------------------------------------------------------------------------------

def test_a_low_ratio_is_explained_by_kernel_eager_mode_pressure_and_a_neighbour(node):
    engine = _engine(node, config={"enforce_eager": True},
                     findings=[{"code": "moe-backend-unset", "severity": "warning",
                                "message": "set --moe-backend marlin"}])
    neighbour = _engine(node, name="gemma", model=GEMMA)
    now = timezone.now()
    _collections(engine, now, running=[1, 1, 1], decode=[12.0, 11.0, 12.5])
    _collections(neighbour, now, running=[4, 4, 4], decode=[142.0, 140.0, 141.0])
    host_sample(node, Metric.PSI_SOME_AVG10, now - timedelta(seconds=7), 18.0)

    roofline = _roofline(engine)

    assert roofline["verdict"] == "low" and roofline["ratio"] < 0.4
    text = " ".join(roofline["explanations"])
    assert "Fallback kernel" in text and "moe-backend-unset" in text
    assert "Eager mode" in text
    assert "Memory pressure: PSI (some, avg10) reached 18 %" in text
    assert "A busy neighbour: gemma (2 of 2)" in text


def test_a_low_ratio_without_a_known_cause_says_so(node):
    engine = _engine(node, name="gemma", model=GEMMA)
    now = timezone.now()
    _collections(engine, now, running=[1, 1, 1], decode=[41.1, 41.0, 41.2])

    roofline = _roofline(engine)

    assert roofline["ratio"] == pytest.approx(41.1 / 121.33, abs=0.01)
    assert roofline["explanations"][0].startswith("No known cause found")


def test_faster_than_the_ceiling_points_at_the_inputs(node):
    engine = _engine(node, model="openai/gpt-oss-120b", labels={"sparkops.bytes-per-param": "0.53"})
    now = timezone.now()
    _collections(engine, now, running=[1, 1, 1], decode=[30.0, 31.0, 30.5])

    roofline = _roofline(engine)

    assert roofline["verdict"] == "above"
    assert "counted as dense" in roofline["explanations"][0]


# --- config.json through the container's root ----------------------------------------------------

def _proc_tree(tmp_path: Path, container_id: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text(f"0::/system.slice/docker-{container_id}.scope\n")
    (proc / "77").mkdir()
    (proc / "77" / "cgroup").write_text("0::/user.slice\n")
    return proc


def test_config_json_is_read_inside_the_container(node, tmp_path):
    engine = _engine(node, model="/models/qwen3")
    engine.container_id = "c" * 64
    engine.save()
    proc = _proc_tree(tmp_path, engine.container_id)
    model_dir = proc / "4242" / "root" / "models" / "qwen3"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(QWEN3_30B_A3B))

    config, where = read_container_model_config(engine.config["model"], engine.env, 4242, proc)

    assert config == QWEN3_30B_A3B
    assert where == "/models/qwen3/config.json in the container"


def test_config_json_of_a_hub_model_is_found_in_the_containers_cache(node, tmp_path):
    engine = _engine(node, model="Qwen/Qwen3-30B-A3B", env={"HF_HOME": "/data/hf"})
    engine.container_id = "d" * 64
    engine.save()
    proc = _proc_tree(tmp_path, engine.container_id)
    snapshot = proc / "4242" / "root" / "data/hf/hub/models--Qwen--Qwen3-30B-A3B/snapshots/abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN3_30B_A3B))

    config, where = read_container_model_config(engine.config["model"], engine.env, 4242, proc)

    assert config == QWEN3_30B_A3B and "snapshots/abc/config.json" in where


def test_no_visible_process_says_why(node, tmp_path):
    engine = _engine(node)

    config, why = read_container_model_config(engine.config["model"], engine.env, None,
                                              _proc_tree(tmp_path, "e" * 64))

    assert config is None and "no process of the container is visible" in why


def _container(container_id: str, *, pid: int | None, state: str = "running") -> EngineContainer:
    return EngineContainer(id=container_id, name="qwen", image="vllm", state=state,
                           started_at=datetime(2026, 1, 5, 9, 0, tzinfo=UTC), restart_count=0,
                           exit_code=None, pid=pid, command=[], env={}, labels={}, mounts=[],
                           network_mode="host")


def test_the_collector_reads_config_json_once_per_container_start(tmp_path):
    container = _container("c" * 64, pid=4242)
    proc = _proc_tree(tmp_path, container.id)
    model_dir = proc / "4242" / "root" / "models" / "qwen3"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    now = timezone.now()

    stored = refreshed_model_config({}, container, "/models/qwen3", proc, now)
    assert stored["config"] == QWEN3_30B_A3B
    assert stored["source"] == "/models/qwen3/config.json in the container"

    (model_dir / "config.json").unlink()  # not looked at again for the same start
    assert refreshed_model_config(stored, container, "/models/qwen3", proc, now) is stored
    stopped = _container(container.id, pid=None, state="exited")
    assert refreshed_model_config(stored, stopped, "/models/qwen3", proc, now) is stored


# --- the engine page -----------------------------------------------------------------------------

def test_engine_page_shows_the_roofline_and_the_restart_history(admin_client, node, settings,
                                                                 tmp_path):
    # The page reads config.json from the engine's row only, never from its own host's /proc.
    settings.SPARKOPS_PROCFS = str(tmp_path / "no-proc-here")
    engine = _engine(node)
    now = timezone.now()
    _collections(engine, now, running=[1, 1, 1], decode=[23.0, 23.0, 23.0])
    Restart.objects.create(node=node, engine=engine, kind="planned", status="succeeded",
                           requested_at=now - timedelta(hours=2),
                           started_at=now - timedelta(hours=2),
                           finished_at=now - timedelta(hours=2) + timedelta(minutes=9),
                           startup_seconds=492, outcome="ready after 8 min 12 s")
    Restart.objects.create(node=node, engine=engine, kind="unplanned", status="detected",
                           requested_at=now - timedelta(hours=1), reason="container exited")

    page = admin_client.get(f"/nodes/{node.name}/engines/{engine.name}/").content.decode()

    assert "Bandwidth roofline" in page
    assert 'data-field="ceiling">40.4 tok/s' in page
    assert 'data-field="measured">23.0 tok/s' in page
    assert 'data-field="ratio">0.57<' in page and "57% of the ceiling" in page
    assert "“A12B” in " + NEMOTRON in page
    assert "8 min 12 s" in page and "unplanned" in page and "container exited" in page
    assert "collector reads it while the container runs" in page
