"""llama-swap as an engine kind, against its formats (fixtures from its source, see
tests/fixtures/llamaswap/README.md): the router discovered, ``/running`` and ``/v1/models``
read or refused whole, each model's kind from its ``cmd``, and a model with a TTL never read
through the router (a read would keep it loaded)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from collectors.adoption import ModelProcess, attribute, runs_command
from collectors.kinds.discovery import kind_of
from collectors.kinds.llamaswap import (
    LlamaSwapReader,
    model_kind,
    parse_launch,
    parse_models,
    parse_running,
    read_router,
    ttl_words,
)
from collectors.kinds.registry import READERS
from collectors.vllm.scrape import ScrapeError
from tests.conftest import PROJECT
from tests.scrape import faultserver
from tests.scrape.faultserver import FaultServer

FIXTURES = PROJECT / "tests" / "fixtures" / "llamaswap"
RUNNING = json.loads((FIXTURES / "running.json").read_text())
MODELS = json.loads((FIXTURES / "models.json").read_text())


def test_a_router_container_is_discovered_as_llamaswap():
    assert kind_of({}, ["/app/llama-swap", "-config", "/app/config.yaml"], "x") == "llamaswap"
    # Its image carries llama-server too (the unified images): the router still wins.
    assert kind_of({}, ["sh"], "ghcr.io/mostlygeek/llama-swap:cuda") == "llamaswap"
    assert kind_of({"sparkops.engine": "llama-swap"}, ["x"], "y") == "llamaswap"
    assert "llamaswap" in READERS


def test_running_lists_each_running_model_with_its_cmd_proxy_and_ttl():
    models = {m.name: m for m in parse_running(RUNNING)}
    assert models["qwen3-30b"].state == "ready" and models["qwen3-30b"].ttl == 300
    assert models["qwen3-30b"].proxy == "http://127.0.0.1:5800"
    assert models["coder"].state == "starting"


def test_models_keeps_the_routers_own_models_only():
    listed = {m.name: m for m in parse_models(MODELS)}
    assert set(listed) == {"gemma-3-27b", "qwen3-30b"}  # the peer and the selector are left out
    assert listed["gemma-3-27b"].status == "unloaded"
    assert listed["gemma-3-27b"].aliases == ("gemma",)


@pytest.mark.parametrize(("data", "reason"), [
    ({"data": []}, "no running list"),
    ({"running": [{"model": "a", "state": "loaded", "cmd": "x", "proxy": "y", "ttl": 0}]},
     "invalid entry"),
    ({"running": [{"model": "a", "state": "ready", "cmd": "x", "proxy": "y", "ttl": "300"}]},
     "invalid entry"),
    ({"running": [{"model": "a", "state": "ready", "cmd": "x", "proxy": "y", "ttl": -1}]},
     "invalid entry"),
])
def test_a_running_list_that_is_not_llama_swaps_is_refused(data, reason):
    with pytest.raises(ScrapeError, match=reason):
        parse_running(data)


@pytest.mark.parametrize(("data", "reason"), [
    ({"object": "list"}, "no data list"),
    # Another server's OpenAI model list (vLLM's) has no meta.llamaswap.
    ({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]},
     "no meta.llamaswap"),
    ({"data": [{"id": "m", "status": {"value": "sleeping"}, "meta": {"llamaswap": {
        "type": "model"}}}]}, "neither loaded nor unloaded"),
])
def test_a_model_list_that_is_not_llama_swaps_is_refused(data, reason):
    with pytest.raises(ScrapeError, match=reason):
        parse_models(data)


@pytest.mark.parametrize(("cmd", "kind"), [
    ("/app/llama-server --port 5800 -m /models/q.gguf", "llamacpp"),
    ("vllm serve Qwen/Qwen3-8B --port 5801", "vllm"),
    ("python3 -m sglang.launch_server --model-path x --port 5802", "sglang"),
    ("docker run --rm ollama/ollama", "ollama"),
    ("/opt/whisper-server --port 5803", None),
])
def test_a_models_kind_comes_from_its_cmd(cmd, kind):
    assert model_kind(cmd) == kind


def test_the_routers_launch_gives_its_port():
    assert parse_launch(["/app/llama-swap", "-config", "/c.yaml"], {}).port == 8080
    assert parse_launch(["llama-swap", "--listen=127.0.0.1:9292", "-watch-config"], {}).port \
        == 9292


def test_the_ttl_is_said_in_words():
    assert ttl_words(300) == "unloads after 300 s idle"
    assert ttl_words(0).startswith("never unloaded")
    assert ttl_words(None).startswith("unknown")


def test_a_wrapper_that_execs_the_engine_is_recognised_by_its_arguments():
    words = ("/app/bin/llama-server", "-m", "/m.gguf", "--port", "5800")
    assert runs_command(words, words)
    assert runs_command(("python3", "-m", "emu", "-m", "/m.gguf", "--port", "5800"), words)
    assert not runs_command(("python3", "-m", "emu", "--port", "5801"), words)


def _router(running: dict, models: dict, upstream_calls: list[str]):
    """A loopback llama-swap answering /running and /v1/models; /upstream answers 500 and is
    recorded (a read through it would start a model or reset its idle timer)."""
    def respond(conn, stop):
        path = server.requests[-1].split(b" ", 2)[1].decode()
        if path.startswith("/upstream/"):
            upstream_calls.append(path)
            body, status = b"no", "500 Internal Server Error"
        else:
            body, status = json.dumps(running if path == "/running" else models).encode(), "200 OK"
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    server = FaultServer(respond)
    return server


@pytest.mark.slow
def test_models_with_a_ttl_or_not_ready_are_never_read_through_the_router():
    calls: list[str] = []
    with _router(RUNNING, MODELS, calls) as server:
        reading = read_router(server.url(""), deadline=4)
    models = {m.name: m for m in reading.models}
    assert calls == []
    assert set(models) == {"coder", "gemma-3-27b", "qwen3-30b"}
    assert models["gemma-3-27b"].state == "unloaded" and models["coder"].listed is False
    assert "restart its 300 s idle timer" in models["qwen3-30b"].unknown["rates"]
    assert "once ready" in models["coder"].unknown["rates"]


@pytest.mark.slow
def test_a_ready_model_without_ttl_is_read_through_upstream_and_its_failure_is_its_own():
    running = {"running": [dict(RUNNING["running"][1], ttl=0)]}
    calls: list[str] = []
    with _router(running, MODELS, calls) as server:
        reading = read_router(server.url(""), deadline=4)
    model = next(m for m in reading.models if m.name == "qwen3-30b")
    assert calls == ["/upstream/qwen3-30b/props"]
    assert model.reading is None and model.read_error.startswith("/upstream/qwen3-30b: GET /props")


@pytest.mark.slow
@pytest.mark.parametrize(("responder", "reason"), [
    (faultserver.complete(b"<html>502</html>", content_type="text/html"), "GET /running: not JSON"),
    (faultserver.short_body(b'{"running": [', declared=400), "GET /running: truncated"),
    (faultserver.complete(b'{"running": [' + b"1," * (3 * 1024**2) + b"1]}",
                          content_type="application/json"), "GET /running: response larger"),
    (faultserver.trickle(at_once=b"HTTP/1.1 200 OK\r\nContent-Length: 900\r\n\r\n{"),
     "GET /running: timed out"),
    (faultserver.complete(b'{"running": "all"}', content_type="application/json"),
     "GET /running: not llama-swap's /running"),
])
def test_a_faulty_running_endpoint_fails_the_read_with_a_reason(responder, reason):
    with FaultServer(responder) as server, pytest.raises(ScrapeError) as failure:
        LlamaSwapReader().read(server.url(""), deadline=2)
    assert reason in str(failure.value) and "\n" not in str(failure.value)


@pytest.mark.slow
def test_each_model_holds_its_own_processes_memory_and_the_router_the_rest():
    child = [sys.executable, "-c", "import time; time.sleep(60)", "--port", "5800"]
    script = f"import subprocess,time; c=subprocess.Popen({child!r}); time.sleep(60)"
    router = subprocess.Popen([sys.executable, "-c", script])
    try:
        holdings = {}
        for _ in range(100):  # until the child is there
            holdings = attribute(router.pid, [ModelProcess("m", tuple(child)),
                                              ModelProcess("gone", ("x", "--port", "1"))])
            if holdings.model_bytes.get("m"):
                break
            subprocess.run(["sleep", "0.05"])
        assert holdings.model_bytes["m"] > 0 and holdings.router_bytes > 0
        assert router.pid in holdings.pids[""] and router.pid not in holdings.pids["m"]
        assert holdings.model_bytes["gone"] is None and "no process" in holdings.reasons["gone"]
    finally:
        for process in subprocess.run(["pgrep", "-P", str(router.pid)], capture_output=True,
                                      text=True).stdout.split():
            subprocess.run(["kill", process])
        router.kill()
        router.wait()


@pytest.mark.django_db
def test_a_model_adopted_from_a_router_is_never_manageable(node):
    """Its container is the router's: a restart would take every other model down with it."""
    from collectors.models import Engine

    adopted = Engine.objects.create(node=node, name="swap/qwen", container_id="c" * 64,
                                    managed=True, config={"router": "swap"})
    plain = Engine.objects.create(node=node, name="vllm", container_id="d" * 64, managed=True)
    assert not adopted.manageable and plain.manageable
