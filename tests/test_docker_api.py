"""The container-engine seam's pure parts: what counts as an engine, times, URLs."""

from datetime import UTC, datetime

import pytest

from collectors.docker_api import (
    EngineContainer,
    is_vllm_engine,
    metrics_base_url,
    parse_docker_time,
)


def _attrs(path="python3", args=(), image="", labels=None):
    return {"Path": path, "Args": list(args), "Config": {"Image": image, "Labels": labels or {}}}


@pytest.mark.parametrize(("attrs", "expected"), [
    (_attrs("vllm", ["serve", "m"]), True),
    (_attrs("/usr/local/bin/vllm", ["serve", "m"]), True),
    (_attrs("python3", ["-m", "vllm.entrypoints.openai.api_server"]), True),
    (_attrs("bash", ["-c", "exec vllm serve m --port 8001"]), True),
    (_attrs("sh", image="nvcr.io/nvidia/vllm:26.08-py3"), True),
    (_attrs("sh", image="eugr/spark-vllm-docker"), True),
    (_attrs("sleep", ["300"], labels={"sparkops.engine": "vllm"}), True),
    (_attrs("vllm", ["serve", "m"], labels={"sparkops.engine": "none"}), False),
    (_attrs("postgres"), False),
    (_attrs("node", ["server.js"], image="openvllmish/app"), False),
])
def test_what_counts_as_a_vllm_engine(attrs, expected):
    assert is_vllm_engine(attrs) is expected


def test_docker_times_with_nanoseconds_and_the_zero_time():
    assert parse_docker_time("2026-11-30T08:15:45.174491257Z") == datetime(
        2026, 11, 30, 8, 15, 45, 174491, tzinfo=UTC)
    assert parse_docker_time("2026-11-30T17:15:45+09:00").utcoffset().total_seconds() == 9 * 3600
    assert parse_docker_time("0001-01-01T00:00:00Z") is None
    assert parse_docker_time("yesterday") is None


def _container(**overrides):
    values = dict(id="c" * 64, name="gemma", image="", state="running", started_at=None,
                  restart_count=0, exit_code=None, pid=1, command=[], env={}, labels={},
                  mounts=[], network_mode="bridge", published_ports={"8001/tcp": 18001})
    values.update(overrides)
    return EngineContainer(**values)


def test_metrics_url_from_label_host_network_or_published_port():
    assert metrics_base_url(_container(labels={"sparkops.url": "http://10.0.0.5:9000/"}), 8001) \
        == "http://10.0.0.5:9000"
    assert metrics_base_url(_container(network_mode="host"), 8001) == "http://127.0.0.1:8001"
    assert metrics_base_url(_container(), 8001) == "http://127.0.0.1:18001"
    assert metrics_base_url(_container(), 8000) is None  # not published: unreachable from here


def test_secret_looking_environment_values_are_masked():
    from collectors.docker_api import masked_env

    env = masked_env({"HF_TOKEN": "hf_abc", "OPENAI_API_KEY": "sk", "VLLM_LOGGING_LEVEL": "INFO",
                      "DB_PASSWORD": "x"})

    assert env["VLLM_LOGGING_LEVEL"] == "INFO"
    assert {env["HF_TOKEN"], env["OPENAI_API_KEY"], env["DB_PASSWORD"]} == {"••••••"}
