"""Launch-command parsing: every accepted spelling, and refusal of values vLLM would refuse."""

from __future__ import annotations

import dataclasses
import json

import pytest

from collectors.vllm.flags import DEFAULT_PORT, FlagError, parse_command_line, parse_human_int

GIB = 2**30


def test_vllm_serve_list_with_positional_model() -> None:
    config = parse_command_line(["vllm", "serve", "nvidia/Gemma-4-26B-A4B-NVFP4", "--port", "8001"])
    assert config.launcher == "vllm serve"
    assert config.model == "nvidia/Gemma-4-26B-A4B-NVFP4"
    assert config.port == 8001
    assert config.port_explicit is True


def test_port_defaults_to_8000_and_says_so() -> None:
    config = parse_command_line(["vllm", "serve", "org/model"])
    assert config.port == DEFAULT_PORT == 8000
    assert config.port_explicit is False


def test_python_module_api_server_with_model_flag() -> None:
    config = parse_command_line(
        ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "x/y", "--port", "9000"]
    )
    assert (config.launcher, config.model, config.port) == ("api_server", "x/y", 9000)


def test_cli_main_module_serve() -> None:
    config = parse_command_line("python3 -m vllm.entrypoints.cli.main serve org/m --port 8005")
    assert (config.launcher, config.model, config.port) == ("vllm serve", "org/m", 8005)


def test_shell_string_is_split_like_a_shell() -> None:
    config = parse_command_line(
        "vllm serve org/model --served-model-name 'my model' --speculative-config "
        '\'{"method": "ngram", "num_speculative_tokens": 4}\''
    )
    assert config.served_model_name == "my model"
    assert config.speculative_config_json == {"method": "ngram", "num_speculative_tokens": 4}


def test_entrypoint_plus_cmd_behind_sh_c_with_other_commands() -> None:
    argv = [
        "/bin/bash",
        "-c",
        "pip install -q some-extra && VLLM_LOGGING_LEVEL=INFO exec vllm serve org/model \\\n"
        "  --max-model-len 32768 2>&1 | tee /tmp/vllm.log",
    ]
    config = parse_command_line(argv)
    assert config.model == "org/model"
    assert config.max_model_len == 32768
    assert "tee" not in config.all_flags
    assert config.unknown_flags == {}


def test_fd_redirection_is_not_an_argument() -> None:
    assert parse_command_line("vllm serve m --port 8001 2>&1 | tee log").port == 8001
    assert parse_command_line("vllm serve m --max-num-seqs 2 > /tmp/vllm.log").max_num_seqs == 2
    # In sh, "2>&1" right after a flag leaves the flag without a value, as vLLM would see it.
    with pytest.raises(FlagError, match="--max-num-seqs needs a value"):
        parse_command_line("vllm serve m --max-num-seqs 2>&1 | tee log")


def test_empty_argument_is_a_value() -> None:
    config = parse_command_line("vllm serve m --chat-template '' --port 8001")
    assert config.all_flags["chat-template"] == ""
    assert config.port == 8001


def test_newline_separates_commands_in_a_script() -> None:
    config = parse_command_line(["sh", "-c", "nvidia-smi\nvllm serve org/m --port 8009\necho done"])
    assert (config.model, config.port) == ("org/m", 8009)


def test_full_path_to_vllm_binary() -> None:
    config = parse_command_line(["/opt/venv/bin/vllm", "serve", "org/m"])
    assert config.model == "org/m"


def test_arguments_only_cmd_for_an_image_whose_entrypoint_is_vllm_serve() -> None:
    config = parse_command_line(["--model", "org/m", "--port", "8002"])
    assert (config.launcher, config.model, config.port) == ("arguments only", "org/m", 8002)


@pytest.mark.parametrize("argv", [["bash", "start.sh"], [], "nginx -g 'daemon off;'"])
def test_no_vllm_invocation_is_refused(argv: list[str] | str) -> None:
    with pytest.raises(FlagError, match="no vLLM launch found"):
        parse_command_line(argv)


def test_equals_and_space_forms_read_the_same() -> None:
    spaced = parse_command_line("vllm serve m --max-num-seqs 16 --kv-cache-dtype fp8")
    joined = parse_command_line("vllm serve m --max-num-seqs=16 --kv-cache-dtype=fp8")
    assert (spaced.max_num_seqs, spaced.kv_cache_dtype) == (16, "fp8")
    assert (joined.max_num_seqs, joined.kv_cache_dtype) == (16, "fp8")


def test_underscores_are_dashes() -> None:
    config = parse_command_line("vllm serve m --max_model_len 8192 --gpu_memory_utilization=0.3")
    assert config.max_model_len == 8192
    assert config.gpu_memory_utilization == 0.3
    assert "max-model-len" in config.all_flags


def test_unambiguous_prefix_as_printed_in_vllm_sizing_advice() -> None:
    config = parse_command_line("vllm serve m --kv-cache-memory=6549798502")
    assert config.kv_cache_memory_bytes == 6549798502
    assert config.unknown_flags == {}


def test_ambiguous_prefix_is_left_as_an_unknown_flag() -> None:
    config = parse_command_line("vllm serve m --max-num 4")
    assert config.max_num_seqs is None
    assert config.unknown_flags == {"max-num": "4"}


def test_aliases() -> None:
    config = parse_command_line(
        "vllm serve m -q fp8 -sc '{\"method\":\"mtp\"}' -tp 2 --device-memory-utilization 0.4"
    )
    assert config.quantization == "fp8"
    assert config.speculative_config_json == {"method": "mtp"}
    assert config.gpu_memory_utilization == 0.4
    assert config.all_flags["tensor-parallel-size"] == "2"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8G", 8 * GIB),
        ("8g", 8_000_000_000),
        ("512M", 512 * 2**20),
        ("512m", 512_000_000),
        ("1K", 1024),
        ("1k", 1000),
        ("1.5g", 1_500_000_000),
        ("25.6k", 25_600),
        ("2T", 2 * 2**40),
        ("21474836480", 21_474_836_480),
    ],
)
def test_human_readable_ints_follow_vllm(text: str, expected: int) -> None:
    assert parse_human_int(text) == expected
    config = parse_command_line(["vllm", "serve", "m", "--kv-cache-memory-bytes", text])
    assert config.kv_cache_memory_bytes == expected


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("1.5G", "write 1.5g"),  # vLLM: no decimals with binary suffixes
        ("8GiB", "write 8G"),
        ("8 GB", "write 8G"),
        ("lots", "not an integer"),
        ("0", "greater than 0"),
        ("-5", "greater than 0"),
    ],
)
def test_kv_cache_bytes_vllm_would_refuse(text: str, hint: str) -> None:
    with pytest.raises(FlagError) as raised:
        parse_command_line(["vllm", "serve", "m", "--kv-cache-memory-bytes", text])
    message = str(raised.value)
    assert message.startswith("--kv-cache-memory-bytes: ")
    assert hint in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [("131072", 131072), ("131k", 131_000), ("128K", 131_072), ("1m", 1_000_000), ("32K", 32768)],
)
def test_max_model_len_spellings(text: str, expected: int) -> None:
    config = parse_command_line(["vllm", "serve", "m", "--max-model-len", text])
    assert config.max_model_len == expected
    assert config.max_model_len_auto is False


@pytest.mark.parametrize("text", ["auto", "-1", "AUTO"])
def test_max_model_len_auto(text: str) -> None:
    config = parse_command_line(["vllm", "serve", "m", "--max-model-len", text])
    assert config.max_model_len is None
    assert config.max_model_len_auto is True


def test_max_num_batched_tokens_accepts_human_ints() -> None:
    config = parse_command_line("vllm serve m --max-num-batched-tokens 8k --block-size 32")
    assert config.max_num_batched_tokens == 8000
    assert config.block_size == 32


@pytest.mark.parametrize(
    ("flags", "flag_name"),
    [
        ("--max-num-seqs abc", "--max-num-seqs"),
        ("--max-num-seqs 1k", "--max-num-seqs"),  # a plain int in vLLM, no suffixes
        ("--max-num-seqs 0", "--max-num-seqs"),
        ("--port http", "--port"),
        ("--port 70000", "--port"),
        ("--gpu-memory-utilization 85", "--gpu-memory-utilization"),
        ("--gpu-memory-utilization 0", "--gpu-memory-utilization"),
        ("--gpu-memory-utilization half", "--gpu-memory-utilization"),
        ("--max-model-len 0", "--max-model-len"),
        ("--block-size 1.5", "--block-size"),
    ],
)
def test_bad_values_raise_with_the_flag_named(flags: str, flag_name: str) -> None:
    with pytest.raises(FlagError) as raised:
        parse_command_line(f"vllm serve m {flags}")
    assert str(raised.value).startswith(f"{flag_name}: ")
    assert "\n" not in str(raised.value)


def test_known_flag_without_value_is_refused() -> None:
    with pytest.raises(FlagError, match=r"^--port needs a value$"):
        parse_command_line("vllm serve m --port")
    with pytest.raises(FlagError, match=r"^--max-num-seqs needs a value$"):
        parse_command_line("vllm serve m --max-num-seqs --enforce-eager")


def test_negative_number_is_a_value_not_a_flag() -> None:
    assert parse_command_line("vllm serve m --max-model-len -1").max_model_len_auto is True


def test_enforce_eager_switch_and_its_negation() -> None:
    assert parse_command_line("vllm serve m").enforce_eager is False
    assert parse_command_line("vllm serve m --enforce-eager").enforce_eager is True
    negated_eager = parse_command_line("vllm serve m --enforce-eager --no-enforce-eager")
    assert negated_eager.enforce_eager is False
    negated = parse_command_line("vllm serve m --no-enable-prefix-caching")
    assert negated.all_flags["enable-prefix-caching"] is False


def test_switch_does_not_swallow_the_model() -> None:
    config = parse_command_line("vllm serve --trust-remote-code org/model --enforce-eager")
    assert config.model == "org/model"
    assert config.all_flags["trust-remote-code"] is True


def test_switch_with_a_value_is_refused() -> None:
    with pytest.raises(FlagError, match="--enforce-eager is a switch and takes no value"):
        parse_command_line("vllm serve m --enforce-eager=true")


def test_served_model_name_takes_several_names_and_keeps_the_first() -> None:
    config = parse_command_line("vllm serve m --served-model-name gemma gemma-4 --port 8001")
    assert config.served_model_name == "gemma"
    assert config.served_model_names == ("gemma", "gemma-4")
    assert config.port == 8001


def test_positional_model_wins_over_model_flag() -> None:
    assert parse_command_line("vllm serve a/b --model c/d").model == "a/b"


def test_extra_positional_is_refused() -> None:
    with pytest.raises(FlagError, match="unexpected argument 'stray'"):
        parse_command_line("vllm serve a/b --enforce-eager stray")


def test_api_server_takes_no_positional() -> None:
    with pytest.raises(FlagError, match="unexpected argument 'a/b'"):
        parse_command_line("python -m vllm.entrypoints.openai.api_server a/b")


def test_speculative_config_that_is_not_json_is_kept_raw() -> None:
    config = parse_command_line("vllm serve m --speculative-config {broken")
    assert config.speculative_config == "{broken"
    assert config.speculative_config_json is None


def test_moe_backend_is_normalised_like_vllm() -> None:
    assert parse_command_line("vllm serve m --moe-backend FlashInfer-CUTLASS").moe_backend == (
        "flashinfer_cutlass"
    )


def test_unknown_flags_are_kept_and_last_repeat_wins() -> None:
    config = parse_command_line(
        "vllm serve m --tensor-parallel-size 2 --max-num-partial-prefills 4 --port 1 --port 2 "
        "--some-new-switch"
    )
    assert config.port == 2
    assert dict(config.unknown_flags) == {
        "tensor-parallel-size": "2",
        "max-num-partial-prefills": "4",
        "some-new-switch": True,
    }
    assert config.all_flags["port"] == "2"


def test_config_is_frozen_and_json_ready() -> None:
    config = parse_command_line("vllm serve m --served-model-name a b --enforce-eager")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.all_flags["port"] = "1"  # type: ignore[index]
    data = json.loads(json.dumps(config.as_dict()))
    assert data["served_model_names"] == ["a", "b"]
    assert data["all_flags"] == {"served-model-name": ["a", "b"], "enforce-eager": True}
    assert data["kv_cache_memory_bytes"] is None
