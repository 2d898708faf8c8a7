"""``manage.py inspect``: in process through call_command, and as a real subprocess."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

REPO = Path(__file__).resolve().parent.parent.parent
LOGS = REPO / "tests" / "fixtures" / "vllm_logs"
METRICS = REPO / "tests" / "fixtures" / "vllm_metrics"
FLAGS_JSON_KEYS = {
    "model",
    "served_model_name",
    "kv_cache_memory_bytes",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_dtype",
    "moe_backend",
    "quantization",
    "findings",
}


def run_inspect(*args: str, stdin: str | None = None) -> str:
    out = io.StringIO()
    options: dict[str, object] = {"stdout": out}
    if stdin is not None:
        options["stdin"] = io.StringIO(stdin)
    call_command("inspect", *args, **options)
    return out.getvalue()


def run_manage(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SPARKOPS_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "sparkops.settings",
    }
    return subprocess.run(
        [sys.executable, "manage.py", "inspect", *args],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


# --- log ------------------------------------------------------------------------------------------


def test_log_json_from_file() -> None:
    data = json.loads(run_inspect("log", str(LOGS / "v033_pinned.log"), "--json"))
    assert data["phase"] == "ready"
    assert (data["kv_cache_gib"], data["kv_cache_pinned"], data["kv_cache_tokens"]) == (
        20.0,
        True,
        1_230_848,
    )
    assert data["errors"] == []


def test_log_json_from_stdin() -> None:
    text = (LOGS / "fail_max_seq_len.log").read_text(encoding="utf-8")
    data = json.loads(run_inspect("log", "-", "--json", stdin=text))
    assert data["phase"] == "failed"
    assert [error["kind"] for error in data["errors"]] == ["max-seq-len-too-long"]


def test_log_human_summary_has_units_and_unknowns() -> None:
    out = run_inspect("log", str(LOGS / "v033_pinned.log"))
    assert "phase:                ready" in out
    assert "KV cache:             20 GiB (pinned by --kv-cache-memory-bytes)" in out
    assert "KV capacity:          1,230,848 tokens" in out
    assert "max concurrency:      9.39x at 131,072 tokens per request" in out
    assert "CUDA graphs:          0.62 GiB measured, -2.41 GiB estimated" in out
    assert "GPU blocks:           unknown" in out


def test_log_human_summary_never_shows_zero_for_unknown() -> None:
    out = run_inspect("log", str(LOGS / "v0_no_prefix.log"))
    assert "ready at:             unknown" in out
    assert "engine init:          unknown" in out
    assert " 0 s" not in out and " 0 GiB" not in out


def test_log_failure_lists_the_errors() -> None:
    out = run_inspect("log", str(LOGS / "fail_ptx_toolchain.log"))
    assert "phase:                failed" in out
    assert "  [ptx-toolchain] torch.AcceleratorError: CUDA error: the provided PTX" in out


@pytest.mark.parametrize(
    ("args", "stdin", "reason"),
    [
        (("log", "/nonexistent/vllm.log"), None, "cannot read /nonexistent/vllm.log: No such file"),
        (("log", "-"), "", "stdin is empty"),
        (("log", "-"), "just some\nother program\n", "no vLLM startup line recognised in stdin"),
        (("log", "a.log", "b.log"), None, "inspect log takes one source, got 2"),
    ],
)
def test_log_unusable_input(args: tuple[str, ...], stdin: str | None, reason: str) -> None:
    with pytest.raises(CommandError) as raised:
        run_inspect(*args, stdin=stdin)
    assert str(raised.value).startswith(reason)
    assert "\n" not in str(raised.value)


# --- flags ----------------------------------------------------------------------------------------


def test_flags_json() -> None:
    command = (
        "vllm serve nvidia/Gemma-4-26B-A4B-NVFP4 --served-model-name gemma --port 8001 "
        "--kv-cache-memory-bytes 20G --gpu-memory-utilization 0.1 --max-model-len 128K "
        "--max-num-seqs 16 --max-num-batched-tokens 8192 --kv-cache-dtype fp8 "
        "--quantization modelopt"
    )
    data = json.loads(run_inspect("flags", command, "--json"))
    assert set(data) >= FLAGS_JSON_KEYS
    assert data["model"] == "nvidia/Gemma-4-26B-A4B-NVFP4"
    assert data["served_model_name"] == "gemma"
    assert data["kv_cache_memory_bytes"] == 21_474_836_480
    assert data["gpu_memory_utilization"] == 0.1
    assert data["max_model_len"] == 131_072
    assert (data["max_num_seqs"], data["max_num_batched_tokens"]) == (16, 8192)
    assert (data["kv_cache_dtype"], data["moe_backend"], data["quantization"]) == (
        "fp8",
        None,
        "modelopt",
    )
    assert [f["code"] for f in data["findings"]] == [
        "quantization-on-prequantized",
        "moe-backend-unset",
        "kv-bytes-skips-precheck",
    ]
    assert {f["severity"] for f in data["findings"]} == {"error", "warning"}


def test_flags_given_as_separate_words_after_double_dash() -> None:
    data = json.loads(run_inspect("flags", "--json", "--", "vllm", "serve", "m", "--port", "8005"))
    assert (data["model"], data["port"]) == ("m", 8005)


def test_flags_from_stdin() -> None:
    data = json.loads(run_inspect("flags", "-", "--json", stdin="vllm serve a/b --enforce-eager\n"))
    assert data["model"] == "a/b"
    assert [f["code"] for f in data["findings"]] == ["enforce-eager"]


def test_flags_human_summary() -> None:
    out = run_inspect("flags", "vllm serve a/b --kv-cache-memory-bytes 8G --max-num-seqs 32")
    assert "KV cache size:          8,589,934,592 bytes (8.00 GiB, pinned)" in out
    assert "max num seqs:           32 sequences" in out
    assert "GPU memory utilization: not set (vLLM default)" in out
    assert "port:                   8000 (vLLM default)" in out
    assert "  [warning] kv-bytes-default-utilization: " in out


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("vllm serve m --max-num-seqs abc", "--max-num-seqs: 'abc' is not an integer"),
        ("vllm serve m --kv-cache-memory-bytes 1.5G", "--kv-cache-memory-bytes: '1.5G': vLLM"),
        ("bash run.sh", "no vLLM launch found"),
    ],
)
def test_flags_unusable_input(command: str, reason: str) -> None:
    with pytest.raises(CommandError) as raised:
        run_inspect("flags", command)
    assert str(raised.value).startswith(reason)


# --- metrics --------------------------------------------------------------------------------------


def test_metrics_json_from_file_matches_the_parser() -> None:
    from collectors.vllm.metrics import parse_metrics_text

    path = METRICS / "vllm_0_33_hybrid_spec.txt"
    data = json.loads(run_inspect("metrics", str(path), "--json"))
    expected = parse_metrics_text(path.read_text(encoding="utf-8")).as_dict()
    assert data == json.loads(json.dumps(expected))
    assert data["kv_cache_size_tokens"] == 1_230_848


def test_metrics_human_summary() -> None:
    out = run_inspect("metrics", str(METRICS / "vllm_0_33_hybrid_spec.txt"))
    assert "kv cache size tokens:" in out and "1,230,848 tokens" in out
    assert "kv cache memory bytes:" in out and "(20.00 GiB)" in out
    assert "% of KV blocks in use" in out


def test_metrics_unusable_text_is_one_line() -> None:
    with pytest.raises(CommandError) as raised:
        run_inspect("metrics", "-", stdin="this is not prometheus text\n")
    assert "\n" not in str(raised.value)
    assert str(raised.value)


class _MetricsHandler(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def metrics_server() -> Iterator[str]:
    handler = type(
        "Handler",
        (_MetricsHandler,),
        {"body": (METRICS / "vllm_0_33_hybrid_spec.txt").read_bytes()},
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def test_metrics_from_a_real_loopback_endpoint(metrics_server: str) -> None:
    data = json.loads(run_inspect("metrics", metrics_server, "--json"))
    assert (data["model_name"], data["kv_cache_size_tokens"]) == ("nemotron-3-super", 1_230_848)


def test_metrics_endpoint_refusing_connections_is_one_line() -> None:
    with pytest.raises(CommandError) as raised:
        run_inspect("metrics", "http://127.0.0.1:9/metrics")
    assert str(raised.value)
    assert "\n" not in str(raised.value)


# --- as a real process ----------------------------------------------------------------------------


@pytest.mark.slow
def test_subprocess_log_from_stdin_json(tmp_path: Path) -> None:
    text = (LOGS / "compose_v027_moe_flashinfer.log").read_text(encoding="utf-8")
    result = run_manage(tmp_path, "log", "-", "--json", stdin=text)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["phase"], data["version"], data["cuda_graph_gib"]) == ("ready", "0.27.1", -0.45)


@pytest.mark.slow
def test_subprocess_flags_json(tmp_path: Path) -> None:
    result = run_manage(tmp_path, "flags", "vllm serve m --max-num-partial-prefills 2", "--json")
    assert result.returncode == 0, result.stderr
    assert [f["code"] for f in json.loads(result.stdout)["findings"]] == ["removed-flag"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "stdin", "reason"),
    [
        (("log", "-", "--json"), "", "stdin is empty"),
        (("log", "-", "--json"), "nothing to see\n", "no vLLM startup line recognised in stdin"),
        (("log", "/nonexistent/vllm.log"), "", "cannot read /nonexistent/vllm.log"),
        (("flags", "vllm serve m --max-num-seqs abc", "--json"), "", "--max-num-seqs: 'abc'"),
    ],
)
def test_subprocess_unusable_input_exits_non_zero_with_one_line(
    tmp_path: Path, args: tuple[str, ...], stdin: str, reason: str
) -> None:
    result = run_manage(tmp_path, *args, stdin=stdin)
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"CommandError: {reason}")
