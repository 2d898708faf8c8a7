"""Launch flags → the span an engine container belongs to (collectors.spanning), per backend.

The command lines are written as each engine's own documentation or source shows them; each
case names the release and file it comes from.
"""

from __future__ import annotations

import pytest

from collectors import docker_api
from collectors.docker_api import ContainerEngineError
from collectors.emulator.cli import parse_args
from collectors.emulator.headless import worker_name
from collectors.kinds.sglang import parse_launch as sglang_launch
from collectors.spanning import span_of
from collectors.vllm.flags import parse_command_line

MODEL = "/path/to/the/model/in/the/container"


def _vllm(command, env=None, labels=None):
    """The span of a vLLM container whose command is ``command`` (a shell line or words)."""
    words = command if isinstance(command, list) else [command]
    try:
        config = parse_command_line(command).as_dict()
    except ValueError:
        config = None  # e.g. a Ray node's `ray start`: no vLLM launch in the command
    return span_of("vllm", config, words, env or {}, labels or {})


def _sglang(command, labels=None):
    return span_of("sglang", sglang_launch(command.split(), {}).config, command.split(), {},
                   labels or {})


# vLLM 0.33.0, docs/serving/parallelism_scaling.md:145-159 ("Running vLLM with
# MultiProcessing"); flags from vllm/engine/arg_utils.py:1170-1178, 1208.
MP_HEAD = (f"vllm serve {MODEL} --tensor-parallel-size 8 --pipeline-parallel-size 2 "
           "--nnodes 2 --node-rank 0 --master-addr 10.0.0.1")
MP_RANK = (f"vllm serve {MODEL} --tensor-parallel-size 8 --pipeline-parallel-size 2 "
           "--nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --headless")


def test_vllm_multi_node_head_and_headless_rank_share_one_key():
    head, rank = _vllm(MP_HEAD), _vllm(MP_RANK)

    assert head.key == rank.key == f"vllm-mp|10.0.0.1:29501|{MODEL}"
    assert head.as_dict() == {
        "role": "head", "rank": 0, "ranks": 2, "local": 1, "backend": "mp",
        "rendezvous": "10.0.0.1:29501", "serves_api": True,
        "basis": "--nnodes 2, --node-rank 0, --master-addr 10.0.0.1, --master-port unset "
                 "(29501, vLLM's default)"}
    assert (rank.role, rank.rank, rank.ranks, rank.serves_api) == ("rank", 1, 2, False)
    assert "--headless" in rank.basis


def test_vllm_short_flags_and_an_explicit_master_port():
    # -n and -r are --nnodes and --node-rank's own aliases (arg_utils.py:1177-1178).
    rank = _vllm("vllm serve org/gemma -tp 2 -n 2 -r 1 --master-addr 192.168.100.10 "
                 "--master-port 29600 --headless")

    assert rank.key == "vllm-mp|192.168.100.10:29600|org/gemma"
    assert (rank.rank, rank.ranks, rank.serves_api) == (1, 2, False)


def test_a_model_or_rendezvous_of_its_own_is_another_engine():
    other_model = _vllm(MP_RANK.replace(MODEL, "/models/other"))
    other_head = _vllm(MP_RANK.replace("10.0.0.1", "10.0.0.7"))

    assert len({_vllm(MP_HEAD).key, other_model.key, other_head.key}) == 3


# vLLM 0.33.0, docs/serving/data_parallel_deployment.md:42-48 (internal load balancing, two
# nodes); the defaults are vllm/engine/arg_utils.py:2539-2562 and vllm/config/parallel.py:161.
DP_HEAD = ("vllm serve $MODEL --data-parallel-size 4 --data-parallel-size-local 2 "
           "--data-parallel-address 10.99.48.128 --data-parallel-rpc-port 13345")
DP_RANK = ("vllm serve $MODEL --headless --data-parallel-size 4 --data-parallel-size-local 2 "
           "--data-parallel-start-rank 2 --data-parallel-address 10.99.48.128 "
           "--data-parallel-rpc-port 13345")


def test_vllm_data_parallel_over_two_nodes():
    head, rank = _vllm(DP_HEAD), _vllm(DP_RANK)

    assert head.key == rank.key == "vllm-dp|10.99.48.128:13345|$MODEL"
    assert (head.role, head.rank, head.local, head.ranks, head.serves_api) == \
        ("head", 0, 2, 4, True)
    assert (rank.role, rank.rank, rank.local, rank.ranks, rank.serves_api) == \
        ("rank", 2, 2, 4, False)
    assert "data-parallel ranks 2–3 of 4" in rank.basis


def test_vllm_data_parallel_api_only_head_and_short_flags():
    # data_parallel_deployment.md:54-60: the API server alone on node 0, every engine on node 1.
    head = _vllm("vllm serve $MODEL -dp 4 -dpl 0 -dpa 10.99.48.128 -dpp 13345")
    rank = _vllm("vllm serve $MODEL --headless --data-parallel-size 4 "
                 "--data-parallel-size-local 4 --data-parallel-address 10.99.48.128 "
                 "--data-parallel-rpc-port 13345")

    assert head.key == rank.key
    assert (head.role, head.local) == ("head", 0)
    assert "no data-parallel rank here (API server only)" in head.basis
    assert (rank.role, rank.rank, rank.local, rank.serves_api) == ("rank", 0, 4, False)


def test_vllm_external_load_balancing_ranks_each_serve_their_api():
    # data_parallel_deployment.md:121-126; the rank address defaults to 29550 without -dpp.
    zero = _vllm("vllm serve $MODEL --data-parallel-size 2 --data-parallel-rank 0 "
                 "--data-parallel-address 10.99.48.128")
    one = _vllm("vllm serve $MODEL --data-parallel-size 2 --data-parallel-rank 1 "
                "--data-parallel-address 10.99.48.128")

    assert zero.key == one.key == "vllm-dp|10.99.48.128:29550|$MODEL"
    assert (zero.role, one.role) == ("head", "rank")
    assert zero.serves_api and one.serves_api


# vLLM 0.33.0, examples/ray_serving/run_cluster.sh: the containers run `ray start` under
# `/bin/bash -c` from a vLLM image; `vllm serve … --distributed-executor-backend ray` is run
# in the head's container afterwards (docs/serving/parallelism_scaling.md:120-137).
RAY_HEAD = ["/bin/bash", "-c", "ray start --block --head --node-ip-address=10.0.0.1 --port=6379"]
RAY_WORKER = ["/bin/bash", "-c",
              "ray start --block --address=10.0.0.1:6379 --node-ip-address=10.0.0.2"]


def test_ray_head_and_worker_containers_share_the_head_address():
    head, worker = _vllm(RAY_HEAD), _vllm(RAY_WORKER)

    assert head.key == worker.key == "ray|10.0.0.1:6379"
    assert (head.role, head.rank, head.backend, head.serves_api) == ("head", 0, "ray", True)
    assert head.ranks is None  # the vllm serve that says how many is not in its command
    assert (worker.role, worker.rank, worker.serves_api) == ("rank", None, False)


def test_ray_head_that_runs_vllm_serve_counts_its_gpus():
    head = _vllm(["bash", "-c", "ray start --head --port=6379 && vllm serve org/gemma "
                  "--tensor-parallel-size 2 --distributed-executor-backend ray"],
                 env={"VLLM_HOST_IP": "10.0.0.1"})

    assert head.key == "ray|10.0.0.1:6379"
    assert head.ranks == 2
    assert "VLLM_HOST_IP=10.0.0.1" in head.basis


def test_ray_head_without_an_address_cannot_be_matched_and_says_so():
    head = _vllm(["ray", "start", "--block", "--head"])

    assert head.key == ""
    assert head.rendezvous is None
    assert "sparkops.span" in head.basis and "port 6379" in head.basis


# SGLang 0.5.23: --nnodes, --node-rank, --dist-init-addr and --tp-size are
# sglang/srt/arg_groups/fields/parallel.py:32-51; a rank >= 1 serves no API
# (sglang/srt/entrypoints/http_server.py:3163, engine.py:1234-1285).
SGLANG = ("python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-405B-Instruct "
          "--tp-size 16 --dist-init-addr 172.16.4.52:20000 --nnodes 2 --node-rank {rank}")


def test_sglang_nodes():
    head, rank = _sglang(SGLANG.format(rank=0)), _sglang(SGLANG.format(rank=1))

    assert head.key == rank.key == "sglang|172.16.4.52:20000|meta-llama/Llama-3.1-405B-Instruct"
    assert (head.role, head.serves_api) == ("head", True)
    assert (rank.role, rank.rank, rank.ranks, rank.serves_api) == ("rank", 1, 2, False)
    assert "--tp-size 16" in rank.basis


def test_sglang_without_dist_init_addr_is_a_span_without_partners():
    rank = _sglang("python3 -m sglang.launch_server --model-path m --nnodes 2 --node-rank 1")

    assert rank.key == "" and rank.role == "rank"
    assert "--dist-init-addr" in rank.basis


def test_the_label_names_a_span_the_flags_cannot():
    labels = {"sparkops.span": "gemma-tp2", "sparkops.span.rank": "1",
              "sparkops.span.ranks": "2"}

    rank = span_of("llamacpp", None, ["llama-server", "-m", "/m.gguf"], {}, labels)
    over_flags = _vllm(MP_RANK, labels={**labels, "sparkops.span.rank": "0"})

    assert (rank.key, rank.role, rank.rank, rank.ranks, rank.backend) == \
        ("label|gemma-tp2", "rank", 1, 2, "label")
    assert not rank.serves_api
    assert (over_flags.key, over_flags.role, over_flags.serves_api) == \
        ("label|gemma-tp2", "head", True)


def test_a_label_rank_that_is_no_number_is_ignored_with_the_reason():
    rank = span_of("vllm", None, [], {}, {"sparkops.span": "x", "sparkops.span.rank": "one"})

    assert rank.rank is None and rank.serves_api
    assert "not a whole number: 'one'" in rank.basis


@pytest.mark.parametrize("command", [
    "vllm serve org/gemma --port 8001",
    "vllm serve org/gemma --tensor-parallel-size 2",  # two GPUs of one node: mp, not spread
    "vllm serve org/gemma --data-parallel-size 2",  # both ranks local
    "vllm serve org/gemma --nnodes 1",
])
def test_an_engine_on_one_node_has_no_span(command):
    assert _vllm(command) is None


def test_other_kinds_have_no_span_without_the_label():
    assert span_of("ollama", {}, ["ollama", "serve"], {}, {}) is None
    assert _sglang("python3 -m sglang.launch_server --model-path m --tp-size 2") is None


def test_vllm_flag_parser_knows_the_short_names():
    flags = parse_command_line("vllm serve m -n 2 -r 1 -dpa 10.0.0.1 -dpp 13345 "
                               "-dpl 1 -dpr 1 --headless").all_flags

    assert flags["nnodes"] == "2" and flags["node-rank"] == "1"
    assert flags["data-parallel-address"] == "10.0.0.1"
    assert flags["data-parallel-rpc-port"] == "13345"
    assert flags["data-parallel-size-local"] == "1"
    assert flags["data-parallel-start-rank"] == "1"
    assert flags["headless"] is True


def test_label_selector(monkeypatch):
    monkeypatch.setenv("SPARKOPS_ENGINE_LABEL_SELECTOR", " sparkops.node = spark-b ,team")
    assert docker_api.label_selector() == ["sparkops.node=spark-b", "team"]

    monkeypatch.setenv("SPARKOPS_ENGINE_LABEL_SELECTOR", "sparkops.node=a,,=b")
    with pytest.raises(ContainerEngineError, match="is not a list of labels"):
        docker_api.label_selector()

    monkeypatch.delenv("SPARKOPS_ENGINE_LABEL_SELECTOR")
    assert docker_api.label_selector() == []


def test_emulator_reads_the_rank_flags():
    config = parse_args(["serve", "m", "--headless", "-n", "2", "-r", "1",
                         "--master-addr", "10.0.0.1", "-tp", "2"])

    assert config.rank.headless and config.rank.nnodes == 2 and config.rank.node_rank == 1
    assert config.rank.master_addr == "10.0.0.1" and config.rank.master_port == 29501
    # vllm/v1/executor/multiproc_executor.py:1214-1229: node 1's worker is tensor rank 1.
    assert worker_name(config.rank) == "Worker_TP1"
    assert worker_name(parse_args(["serve", "m", "--headless", "--nnodes", "2",
                                   "--node-rank", "1", "-pp", "2"]).rank) == "Worker_PP1"


def test_emulator_refuses_a_node_count_below_one():
    from collectors.emulator.cli import CliError

    with pytest.raises(CliError, match="--nnodes: must be > 0"):
        parse_args(["serve", "m", "--nnodes", "0"])


@pytest.mark.django_db
def test_engine_page_of_a_headless_rank_and_the_span_partial(admin_client):
    from django.template.loader import render_to_string

    from collectors.models import Engine, Node
    from dashboard.engines import engine_span

    rows = {}
    for node_name, name, command in (("spark-a", "gemma-tp2", MP_HEAD),
                                     ("spark-b", "gemma-tp2-rank1", MP_RANK)):
        span = _vllm(command)
        rows[name] = Engine.objects.create(
            node=Node.objects.create(name=node_name), name=name, container_id=name,
            container_state="running", phase="kv_allocated", span_key=span.key,
            span=span.as_dict(), memory_usage_bytes=3 * 1024**3)

    page = admin_client.get("/nodes/spark-b/engines/gemma-tp2-rank1/").content.decode()
    span = engine_span(rows["gemma-tp2-rank1"])
    html = render_to_string("dashboard/_engine_span.html", {"span": span})

    health = page.split('data-field="health">', 1)[1].split("</dd>", 1)[0]
    assert health.startswith("container running; a headless rank serves no API")
    assert [(p["node"], p["role"], p["place"], p["held_text"], p["this"])
            for p in span["parts"]] == [("spark-a", "head", "rank 0", "3.0 GiB", False),
                                       ("spark-b", "rank", "rank 1", "3.0 GiB", True)]
    assert '/nodes/spark-a/engines/gemma-tp2/' in html
    assert "gemma-tp2-rank1 (this page)" in html
    assert "2 parts seen of 2 ranks" in html


def _ray_container(command: list[str]):
    from collectors.docker_api import EngineContainer

    return EngineContainer(id="c1", name="ray-node", image="vllm/vllm-openai:v0.33.0",
                           state="running", started_at=None, restart_count=0, exit_code=None,
                           pid=None, command=command, env={}, labels={}, mounts=[],
                           network_mode="host")


def test_a_ray_nodes_flags_are_not_called_unreadable():
    from collectors.engines import _findings, _parse_config, _Seen
    from collectors.kinds.registry import reader_for

    reader = reader_for("vllm")
    for command, words in ((RAY_WORKER, "the engine's flags are its head's"),
                           (RAY_HEAD, "its `vllm serve` runs in it afterwards")):
        container = _ray_container(command)
        launch, why = _parse_config(container, reader)
        seen = _Seen(container, reader, launch, why, None, None, None)

        assert launch is None and words in why
        assert _findings(seen, None, []) == []  # no "cannot read the launch flags" error
    # A container whose command is not vLLM's at all still gets the error finding.
    other = _ray_container(["python", "serve.py", "--port", "8000"])
    launch, why = _parse_config(other, reader)
    findings = _findings(_Seen(other, reader, launch, why, None, None, None), None, [])
    assert [f["code"] for f in findings] == ["unparseable-flags"]
