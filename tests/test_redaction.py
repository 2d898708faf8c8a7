"""The masking rules: what counts as a secret in commands, environments, URLs and log dicts."""

from __future__ import annotations

import pytest

from collectors.redaction import (
    MASK,
    is_secret_name,
    mask_command,
    mask_data,
    mask_env,
    mask_text,
)
from collectors.vllm.flags import parse_command_line

API_KEY = "sk-live-4f9a8b7c6d5e4f3a2b1c"
HF_TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWx"


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "VLLM_API_KEY", "DB_PASS",
    "MYSQL_PWD", "PASSWD", "POSTGRES_PASSWORD", "SENTRY_DSN", "AWS_SECRET_ACCESS_KEY",
    "DBPASSWORD", "HFTOKEN", "apiKey", "--api-key", "--hf-token", "--token", "--password",
    "api_key", "client-secret", "AUTH", "GITHUB_AUTH_TOKEN", "Credentials",
])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "MAX_NUM_BATCHED_TOKENS", "VLLM_MAX_TOKENS", "TOKENIZERS_PARALLELISM", "--tokenizer",
    "--max-num-batched-tokens", "max_num_batched_tokens", "CUDA_VISIBLE_DEVICES", "HF_HOME",
    "VLLM_LOGGING_LEVEL", "PATH", "DATABASE_URL", "--model", "--served-model-name", "passage",
    "sparkops.prefill-bytes-per-token", "KV_BYTES_PER_TOKEN",
])
def test_harmless_names(name):
    assert not is_secret_name(name)


def test_environment_secret_names_whole_and_url_credentials_inside_values():
    env = mask_env({
        "DB_PASS": "hunter2", "MYSQL_PWD": "pw", "PASSWD": "pw", "HF_TOKEN": HF_TOKEN,
        "DATABASE_URL": "postgresql://sparkops:s3cr3t@db.internal:5432/ops",
        "REDIS_URL": "redis://:redispw@127.0.0.1:6379/0",
        "VLLM_MAX_TOKENS": "4096", "TOKENIZERS_PARALLELISM": "false", "HF_HOME": "/models",
        "NOTES": "call with Authorization: Bearer abcdefghijklmnop1234",
    })

    assert {env[n] for n in ("DB_PASS", "MYSQL_PWD", "PASSWD", "HF_TOKEN")} == {MASK}
    assert env["DATABASE_URL"] == f"postgresql://sparkops:{MASK}@db.internal:5432/ops"
    assert env["REDIS_URL"] == f"redis://:{MASK}@127.0.0.1:6379/0"
    assert env["VLLM_MAX_TOKENS"] == "4096"
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    assert env["HF_HOME"] == "/models"
    assert env["NOTES"] == f"call with Authorization: Bearer {MASK}"


def test_secret_looking_environment_values_are_masked():
    env = mask_env({"HF_TOKEN": "hf_abc", "OPENAI_API_KEY": "sk", "VLLM_LOGGING_LEVEL": "INFO",
                    "DB_PASSWORD": "x"})

    assert env["VLLM_LOGGING_LEVEL"] == "INFO"
    assert {env["HF_TOKEN"], env["OPENAI_API_KEY"], env["DB_PASSWORD"]} == {"••••••"}


def test_command_line_secret_flags_in_both_forms_and_secret_shaped_values():
    argv = ["vllm", "serve", "google/gemma", "--api-key", API_KEY, f"--hf-token={HF_TOKEN}",
            "--password", "pw", "--max-num-batched-tokens", "8192", "--tokenizer", "tok/x",
            "--chat-template-url", "https://u:pw@example.org/t?token=abc&lang=en",
            "--some-flag", "ghp_abcdefghijklmnopqrstu1234", "--port", "8001"]

    masked = mask_command(argv)

    assert masked == ["vllm", "serve", "google/gemma", "--api-key", MASK, f"--hf-token={MASK}",
                      "--password", MASK, "--max-num-batched-tokens", "8192", "--tokenizer",
                      "tok/x", "--chat-template-url",
                      f"https://u:{MASK}@example.org/t?token={MASK}&lang=en",
                      "--some-flag", MASK, "--port", "8001"]
    assert mask_command(masked) == masked  # idempotent


def test_secrets_inside_a_shell_script_word():
    script = (f"export DB_PASS=hunter2 && exec vllm serve m --api-key {API_KEY} "
              f"--hf-token='{HF_TOKEN}' --port 8001")

    masked = mask_text(script)

    assert "hunter2" not in masked and API_KEY not in masked and HF_TOKEN not in masked
    assert "--port 8001" in masked and "vllm serve m" in masked
    assert mask_text(masked) == masked


@pytest.mark.parametrize("text", [
    API_KEY, HF_TOKEN, "gho_abcdefghijklmnopqrst12", "AKIAIOSFODNN7EXAMPLE",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "xoxb-1234567890-abcdefghij",
])
def test_credential_shaped_values_are_masked_whatever_their_name(text):
    assert mask_text(f"value {text} end") == f"value {MASK} end"


def test_logged_arguments_mask_secret_keys_and_keep_switches():
    args = {"model": "google/gemma", "api_key": [API_KEY], "hf_token": HF_TOKEN,
            "max_num_batched_tokens": 8192, "enable_auth": True, "kv_cache_memory_bytes": 2**30}

    assert mask_data(args) == {"model": "google/gemma", "api_key": [MASK], "hf_token": MASK,
                               "max_num_batched_tokens": 8192, "enable_auth": True,
                               "kv_cache_memory_bytes": 2**30}


def test_flags_parse_the_same_from_a_masked_command():
    argv = ["vllm", "serve", "google/gemma", "--api-key", API_KEY, "--kv-cache-memory-bytes",
            "20G", "--max-num-seqs", "16", f"--hf-token={HF_TOKEN}", "--port", "8001"]

    plain, masked = parse_command_line(argv), parse_command_line(mask_command(argv))

    assert masked.kv_cache_memory_bytes == plain.kv_cache_memory_bytes == 20 * 2**30
    assert (masked.max_num_seqs, masked.port, masked.model) == (16, 8001, "google/gemma")
    assert masked.all_flags["api-key"] == masked.all_flags["hf-token"] == MASK
    assert API_KEY not in repr(masked.as_dict())
