"""Config findings: each one fires on its evidence, and stays quiet without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.vllm.findings import Finding, MountCheck, check_config
from collectors.vllm.flags import parse_command_line
from collectors.vllm.logs import StartupLog, parse_startup_log

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm_logs"
NVFP4_MOE = "nvidia/Gemma-4-26B-A4B-NVFP4"
# A configuration with nothing to report: pinned KV with a small utilization, Marlin MoE.
CLEAN = (
    f"vllm serve {NVFP4_MOE} --port 8001 --kv-cache-memory-bytes 20G "
    "--gpu-memory-utilization 0.1 --moe-backend marlin"
)


def codes(findings: list[Finding]) -> list[str]:
    return [finding.code for finding in findings]


def by_code(findings: list[Finding], code: str) -> Finding:
    matches = [finding for finding in findings if finding.code == code]
    assert len(matches) == 1, codes(findings)
    return matches[0]


def fixture_log(name: str) -> StartupLog:
    return parse_startup_log((FIXTURES / name).read_text(encoding="utf-8"))


def test_recommended_configuration_has_only_the_precheck_warning() -> None:
    findings = check_config(parse_command_line(CLEAN))
    assert codes(findings) == ["kv-bytes-skips-precheck"]


def test_plain_dense_model_has_no_findings() -> None:
    assert check_config(parse_command_line("vllm serve Qwen/Qwen3-32B-FP8 --port 8002")) == []


# --- quantization-on-prequantized -----------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [NVFP4_MOE, "RedHatAI/Qwen3-32B-FP4", "nvidia/Llama-3.3-70B-Instruct-ModelOpt-fp8"],
)
def test_quantization_flag_on_prequantized_checkpoint(model: str) -> None:
    config = parse_command_line(f"vllm serve {model} --quantization modelopt")
    finding = by_code(check_config(config), "quantization-on-prequantized")
    assert finding.severity == "error"
    assert "--quantization modelopt" in finding.message
    assert "remove --quantization" in finding.message


def test_quantization_flag_on_a_plain_checkpoint_is_not_flagged() -> None:
    config = parse_command_line("vllm serve meta-llama/Llama-3.1-8B-Instruct --quantization fp8")
    assert "quantization-on-prequantized" not in codes(check_config(config))


def test_prequantized_checkpoint_without_the_flag_is_fine() -> None:
    config = parse_command_line(f"vllm serve {NVFP4_MOE} --moe-backend marlin")
    assert check_config(config) == []


def test_quantization_mismatch_in_the_log_is_named() -> None:
    config = parse_command_line("vllm serve some/awq-checkpoint --quantization awq")
    log = fixture_log("fail_quantization_mismatch.log")
    finding = by_code(check_config(config, log=log), "quantization-on-prequantized")
    assert finding.severity == "error"
    assert "(modelopt_fp4) does not match" in finding.message
    # The dedicated finding covers it; it is not repeated as a generic startup error.
    assert "startup-error" not in codes(check_config(config, log=log))


def test_quantization_that_happened_to_match_is_a_warning() -> None:
    config = parse_command_line(
        f"vllm serve {NVFP4_MOE} --quantization modelopt_fp4 --moe-backend marlin"
    )
    ready = fixture_log("v033_pinned.log")
    assert by_code(check_config(config, log=ready), "quantization-on-prequantized").severity == (
        "warning"
    )


# --- moe-backend-unset ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        NVFP4_MOE,
        "nvidia/Nemotron-3-Super-120B-A12B-NVFP4",
        "nvidia/Qwen3-30B-A3B-FP4",
        "nvidia/Mixtral-8x7B-Instruct-v0.1-FP4",
        "org/deepseek-moe-16b-nvfp4",
    ],
)
def test_fp4_moe_without_moe_backend(model: str) -> None:
    finding = by_code(check_config(parse_command_line(f"vllm serve {model}")), "moe-backend-unset")
    assert finding.severity == "warning"
    assert "--moe-backend marlin" in finding.message


@pytest.mark.parametrize(
    "model",
    [
        "Qwen/Qwen3-30B-A3B-FP8",  # MoE but not FP4
        "nvidia/Llama-3.3-70B-Instruct-NVFP4",  # FP4 but dense
        "org/Alpha-4B-NVFP4",  # "-4B" is not an active-parameter marker
    ],
)
def test_not_an_fp4_moe_model(model: str) -> None:
    assert "moe-backend-unset" not in codes(check_config(parse_command_line(f"vllm serve {model}")))


def test_moe_backend_set_silences_it() -> None:
    config = parse_command_line(f"vllm serve {NVFP4_MOE} --moe-backend flashinfer_cutlass")
    assert "moe-backend-unset" not in codes(check_config(config))


def test_log_showing_flashinfer_moe_is_evidence_even_for_an_opaque_name() -> None:
    config = parse_command_line("vllm serve /models/qwen-moe --port 8003")
    log = fixture_log("compose_v027_moe_flashinfer.log")
    finding = by_code(check_config(config, log=log), "moe-backend-unset")
    assert "FLASHINFER_CUTLASS" in finding.message


def test_log_showing_marlin_chosen_automatically_silences_the_name_rule() -> None:
    config = parse_command_line(f"vllm serve {NVFP4_MOE}")
    log = fixture_log("two_startups.log")  # its last startup logged the MARLIN MoE backend
    assert "moe-backend-unset" not in codes(check_config(config, log=log))


def test_log_engine_config_reveals_fp4_for_a_moe_name() -> None:
    config = parse_command_line("vllm serve /models/Qwen3-30B-A3B")
    log = parse_startup_log(
        "INFO 01-30 03:19:14 [core.py:1] Initializing a V1 LLM engine (v0.33.0) with config: "
        "model='/models/Qwen3-30B-A3B', quantization=modelopt_fp4, enforce_eager=False"
    )
    assert "moe-backend-unset" in codes(check_config(config, log=log))
    assert "moe-backend-unset" not in codes(check_config(config))


# --- kv-bytes-skips-precheck and kv-bytes-default-utilization ------------------------------------


def test_pinned_kv_cache_warns_about_the_skipped_precheck() -> None:
    finding = by_code(check_config(parse_command_line(CLEAN)), "kv-bytes-skips-precheck")
    assert finding.severity == "warning"
    assert "21474836480 (20.00 GiB)" in finding.message


def test_unpinned_kv_cache_has_no_precheck_warning() -> None:
    config = parse_command_line("vllm serve m --gpu-memory-utilization 0.35")
    assert check_config(config) == []


def test_pinned_kv_cache_with_default_utilization() -> None:
    config = parse_command_line("vllm serve m --kv-cache-memory-bytes 8G")
    finding = by_code(check_config(config), "kv-bytes-default-utilization")
    assert finding.severity == "warning"
    assert "≈ 112 GiB" in finding.message
    assert "--gpu-memory-utilization" in finding.message


# --- removed-flag -------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--max-num-partial-prefills", "--max_long_partial_prefills"])
def test_removed_flags_on_an_engine_that_refuses_them(flag: str) -> None:
    log = StartupLog(phase="failed", version="0.33.0")
    config = parse_command_line(f"vllm serve m {flag} 2")
    finding = by_code(check_config(config, log=log), "removed-flag")
    assert finding.severity == "error"
    assert flag.replace("_", "-") in finding.message
    assert "0.33.0" in finding.message
    assert "--long-prefill-token-threshold" in finding.message


def test_removed_flag_on_an_older_engine_is_not_a_finding() -> None:
    config = parse_command_line("vllm serve m --max-num-partial-prefills 2")
    old = StartupLog(phase="ready", version="0.26.0")
    assert "removed-flag" not in codes(check_config(config, log=old))
    assert "removed-flag" not in codes(check_config(config, version="0.10.1.1"))


def test_removed_flag_of_an_unknown_version_says_so() -> None:
    finding = by_code(
        check_config(parse_command_line("vllm serve m --max-num-partial-prefills 2")),
        "removed-flag",
    )
    assert finding.severity == "warning"
    assert "not known" in finding.message


def test_removed_flag_refused_in_the_log_is_an_error_whatever_the_version() -> None:
    log = parse_startup_log(
        "usage: vllm serve [model_tag] [options]\n"
        "vllm serve: error: unrecognized arguments: --max-num-partial-prefills 2\n"
    )
    config = parse_command_line("vllm serve m --max-num-partial-prefills 2")
    finding = by_code(check_config(config, log=log), "removed-flag")
    assert finding.severity == "error"
    assert "refused it at startup" in finding.message
    assert [error.kind for error in log.errors] == ["unrecognized-arguments"]


def test_unparsed_startup_line_is_a_finding() -> None:
    log = parse_startup_log(
        "INFO 01-30 03:19:14 [gpu_worker.py:1] Available KV cache memory: None GiB\n"
    )
    finding = by_code(check_config(parse_command_line("vllm serve m"), log=log),
                      "log-line-unparsed")
    assert finding.severity == "warning"
    assert "Available KV cache memory: None GiB" in finding.message
    assert "unknown" in finding.message


def test_current_flags_are_not_removed() -> None:
    config = parse_command_line("vllm serve m --long-prefill-token-threshold 4096")
    assert "removed-flag" not in codes(check_config(config))


# --- enforce-eager ------------------------------------------------------------------------------


def test_enforce_eager_is_info() -> None:
    eager = parse_command_line("vllm serve m --enforce-eager")
    finding = by_code(check_config(eager), "enforce-eager")
    assert finding.severity == "info"
    assert "CUDA graphs" in finding.message
    negated = parse_command_line("vllm serve m --enforce-eager --no-enforce-eager")
    assert check_config(negated) == []


# --- stale-bind-mount ---------------------------------------------------------------------------


def test_replaced_directory_is_a_stale_mount() -> None:
    mount = MountCheck("/srv/site/conf", "/etc/nginx/conf.d", 1_048_601, 1_052_377, True)
    finding = by_code(check_config(parse_command_line(CLEAN), mounts=[mount]), "stale-bind-mount")
    assert finding.severity == "error"
    assert "/srv/site/conf → /etc/nginx/conf.d" in finding.message
    assert "1048601" in finding.message and "1052377" in finding.message
    assert "Recreate the container" in finding.message
    assert "restart keeps the old mount" in finding.message


def test_host_path_gone_is_a_stale_mount() -> None:
    mount = MountCheck("/srv/site/conf", "/etc/nginx/conf.d", 1_048_601, None, False)
    finding = by_code(check_config(parse_command_line(CLEAN), mounts=[mount]), "stale-bind-mount")
    assert "is gone" in finding.message
    assert "Recreate the container" in finding.message


@pytest.mark.parametrize(
    "mount",
    [
        MountCheck("/srv/models", "/models", 4242, 4242, True),
        MountCheck("/srv/models", "/models", None, 4242, True),  # unknown proves nothing
        MountCheck("/srv/models", "/models", 4242, None, True),
    ],
)
def test_healthy_or_unknown_mounts_are_not_flagged(mount: MountCheck) -> None:
    assert "stale-bind-mount" not in codes(check_config(parse_command_line(CLEAN), mounts=[mount]))


# --- findings from the startup log ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "advice"),
    [
        ("fail_free_memory.log", "drop the page cache"),
        ("fail_memory_profiling.log", "one at a time"),
        ("fail_max_seq_len.log", "Lower --max-model-len"),
        ("fail_no_cache_memory.log", "--max-num-batched-tokens"),
        ("fail_ptx_toolchain.log", "driver"),
        ("fail_not_enough_memory.log", "weights did not fit"),
    ],
)
def test_startup_failures_become_findings_with_advice(fixture: str, advice: str) -> None:
    log = fixture_log(fixture)
    finding = by_code(check_config(parse_command_line("vllm serve m"), log=log), "startup-error")
    assert finding.severity == "error"
    assert advice in finding.message
    assert log.errors[0].message in finding.message


def test_ignored_moe_env_var_from_the_log() -> None:
    config = parse_command_line("vllm serve m --moe-backend marlin")
    findings = check_config(config, log=fixture_log("compose_v027_moe_flashinfer.log"))
    finding = by_code(findings, "ignored-env-var")
    assert "VLLM_FLASHINFER_MOE_BACKEND" in finding.message
    # Build metadata variables are harmless noise, not findings.
    assert "VLLM_BUILD_COMMIT" not in " ".join(f.message for f in findings)


def test_findings_are_ordered_by_severity() -> None:
    config = parse_command_line(
        f"vllm serve {NVFP4_MOE} --enforce-eager --quantization modelopt --kv-cache-memory-bytes 8G"
    )
    severities = [finding.severity for finding in check_config(config)]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)
    assert severities[0] == "error" and severities[-1] == "info"


def test_finding_as_dict() -> None:
    finding = Finding("enforce-eager", "info", "text")
    assert finding.as_dict() == {"code": "enforce-eager", "severity": "info", "message": "text"}
