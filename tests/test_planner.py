"""The fit planner on the seed's node: Gemma-4 with a pinned 20 GiB pool next to Nemotron.

Host available memory was 30 GiB before the neighbour's KV pool went 8 → 24 GiB and 14 GiB
after; the planner must tell that before the restart, with Gemma's prefill squeezed, and the
largest pool Nemotron can take while Gemma's prefill still fits.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from collectors import fitplan as planner
from collectors.fitplan import PlanError, PlanRequest
from collectors.ledger import build_ledger
from collectors.models import Engine, Node
from dashboard.alerting.settings import prefill_margin_bytes

pytestmark = pytest.mark.django_db

GIB = 1024**3
MARGIN = 2 * GIB  # the prefill-squeeze alert's default
TOTAL = int(121.69 * GIB)
GEMMA_MODEL = "nvidia/Gemma-4-26B-A4B-NVFP4"
NEMOTRON_MODEL = "nvidia/Nemotron-3-Super-120B-A12B-NVFP4"
GEMMA_NEED = int(12.5 * GIB)  # 8,192 batched tokens x 1,638,400 bytes
NEMOTRON_NEED = 4 * GIB
GEMMA_COMMAND = (f"vllm serve {GEMMA_MODEL} --kv-cache-memory-bytes 20G --kv-cache-dtype fp8 "
                 "--max-model-len 131072 --max-num-batched-tokens 8192 "
                 "--gpu-memory-utilization 0.3")
NEMOTRON_COMMAND = (f"vllm serve {NEMOTRON_MODEL} --kv-cache-memory-bytes {{kv}} "
                    "--max-num-batched-tokens 8192 --gpu-memory-utilization {util}")


def _vllm(node: Node, name: str, command: str, weights_gib: float, kv_gib: float,
          per_token: int, **startup) -> Engine:
    from collectors.vllm.flags import parse_command_line

    config = parse_command_line(command).as_dict()
    return Engine.objects.create(
        node=node, name=name, container_id=name[0] * 64, container_state="running",
        phase="ready", image="vllm/vllm-openai:v0.33.0", started_at=timezone.now()
        - timedelta(days=1), command=command.split(), config=config,
        startup={"phase": "ready", "version": "0.33.0", "weights_gib": weights_gib,
                 "kv_cache_gib": kv_gib, "kv_cache_pinned": True, "cuda_graph_gib": 0.6,
                 **startup},
        prefill_bytes_per_token=per_token,
        gpu_memory_bytes=int((weights_gib + kv_gib + 0.6) * GIB),
        labels={"sparkops.engine": "vllm"})


def seed_node(name: str = "spark-01") -> Node:
    """The seed's node: its engines and the ledger SparkOps stored, 30 GiB available."""
    node = Node.objects.create(name=name, mem_total_bytes=TOTAL)
    gemma = _vllm(node, "gemma-4-26b", GEMMA_COMMAND, 14.6, 20, GEMMA_NEED // 8192,
                  kv_cache_tokens=900_318, max_concurrency=6.87)
    nemotron = _vllm(node, "nemotron-120b", NEMOTRON_COMMAND.format(kv="8G", util="0.8"), 62.9,
                     8, NEMOTRON_NEED // 8192, kv_cache_tokens=1_048_576, max_concurrency=8.0)
    figures = {"mem_total": TOTAL, "mem_available": 30 * GIB, "mem_available_min": 30 * GIB,
               "page_cache_reclaimable": int(3.2 * GIB), "swap_used": 0}
    node.ledger = build_ledger(node, timezone.now(), figures, [gemma, nemotron], []).as_dict()
    node.save()
    return node


def plan_for(node: Node, engine: str | None, command: str, **extra) -> planner.Plan:
    return planner.plan(node, list(node.engines.all()), PlanRequest(engine, command, **extra),
                        margin=MARGIN)


def row(result: planner.Plan, name: str) -> planner.EngineRow:
    return next(r for r in result.rows if r.name == name)


def test_the_neighbour_growing_8_to_24_gib_squeezes_gemmas_prefill():
    node = seed_node()
    result = plan_for(node, "nemotron-120b", NEMOTRON_COMMAND.format(kv="24G", util="0.8"))
    before, after = result.headroom
    assert before.value == 30 * GIB and after.value == 14 * GIB
    assert after.confidence == "reported"  # the pinned pool is exact, the rest reported
    gemma = row(result, "gemma-4-26b")
    assert gemma.fits == (True, False) and gemma.verdict == planner.SQUEEZED
    assert result.verdict == planner.SQUEEZES
    assert result.verdict_text == "Starts, but squeezes gemma-4-26b's prefill."
    nemotron = row(result, "nemotron-120b")
    assert nemotron.kv_pool[0].value == 8 * GIB and nemotron.kv_pool[1].value == 24 * GIB
    assert nemotron.kv_pool[1].confidence == "exact"
    # Its KV tokens: before from its start-up log, after unknown with the reason, never 0.
    assert nemotron.kv_tokens[0].value == 1_048_576
    assert nemotron.kv_tokens[1].value is None
    assert "Mamba" in nemotron.kv_tokens[1].confidence
    assert nemotron.kv_tokens[1].confidence.startswith("unknown — ")


def test_the_largest_pool_leaves_gemmas_prefill_its_margin():
    node = seed_node()
    result = plan_for(node, "nemotron-120b", NEMOTRON_COMMAND.format(kv="24G", util="0.8"))
    weights, graphs = int(62.9 * GIB), int(0.6 * GIB)
    held = weights + 8 * GIB + graphs
    expected = 30 * GIB + held - weights - graphs - MARGIN - GEMMA_NEED
    assert result.largest.pool.value == expected  # 23.5 GiB
    assert "gemma-4-26b's prefill" in result.largest.text
    assert "margin 2.00 GiB" in result.largest.text
    # At exactly that pool Gemma's prefill still fits; a byte more and it would not.
    at_limit = plan_for(node, "nemotron-120b",
                        NEMOTRON_COMMAND.format(kv=str(expected), util="0.8"))
    assert row(at_limit, "gemma-4-26b").verdict == planner.FITS
    over = plan_for(node, "nemotron-120b",
                    NEMOTRON_COMMAND.format(kv=str(expected + 1), util="0.8"))
    assert row(over, "gemma-4-26b").verdict == planner.SQUEEZED


def test_a_smaller_gemma_pool_fits_with_predicted_kv_tokens():
    node = seed_node()
    result = plan_for(node, "gemma-4-26b", GEMMA_COMMAND.replace("20G", "16G"))
    assert result.verdict == planner.FITS
    gemma = row(result, "gemma-4-26b")
    assert gemma.kv_tokens[0].value == 900_318  # the start-up log
    assert gemma.kv_tokens[1].confidence == "exact"
    assert 0 < gemma.kv_tokens[1].value < 900_318
    assert result.headroom[1].value == 34 * GIB
    # The largest pool Gemma can take while Nemotron's 4 GiB prefill fits: 30 + 20 - 2 - 4.
    assert result.largest.pool.value == 30 * GIB + 20 * GIB - MARGIN - NEMOTRON_NEED
    assert result.largest.kv_tokens.value > 900_318


def test_an_engine_refusing_to_start_and_whether_dropping_the_cache_helps():
    node = seed_node()
    # 0.9 x 121.69 GiB = 109.5 GiB, more than the 101.5 GiB free once Nemotron stopped; 0.33
    # reads MemAvailable, which the page cache is already part of.
    refused = plan_for(node, "nemotron-120b", NEMOTRON_COMMAND.format(kv="24G", util="0.9"))
    assert refused.verdict == planner.REFUSES
    assert "refuses to start" in refused.verdict_text
    assert "Dropping the page cache first would not help." in refused.verdict_text
    assert row(refused, "nemotron-120b").fits[1] is None
    # 0.19 reads MemFree, 3.2 GiB less: 0.82 x total (99.8 GiB) refuses with the cache, starts
    # without it.
    older = plan_for(node, "nemotron-120b", NEMOTRON_COMMAND.format(kv="24G", util="0.82"),
                     version="0.19.1")
    assert older.verdict == planner.REFUSES
    assert "Dropping the page cache first would let it start." in older.verdict_text
    dropped = plan_for(node, "nemotron-120b", NEMOTRON_COMMAND.format(kv="24G", util="0.82"),
                       version="0.19.1", drop_page_cache=True)
    assert dropped.verdict != planner.REFUSES and dropped.page_cache[1].value == 0


def test_a_pool_beyond_the_hosts_memory_is_out_of_memory():
    node = seed_node()
    result = plan_for(node, "nemotron-120b", NEMOTRON_COMMAND.format(kv="60G", util="0.3"))
    assert result.verdict == planner.OUT_OF_MEMORY
    assert result.headroom[1].value < 0


def test_a_compose_service_is_read_like_its_command():
    node = seed_node()
    service = """services:
  nemotron:
    image: vllm/vllm-openai:v0.33.0
    command: ["nvidia/Nemotron-3-Super-120B-A12B-NVFP4", "--kv-cache-memory-bytes", "24G",
              "--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.8"]
"""
    result = plan_for(node, "nemotron-120b", service)
    assert result.headroom[1].value == 14 * GIB and result.verdict == planner.SQUEEZES


def test_a_new_engine_next_to_both():
    node = seed_node()
    result = plan_for(node, None, "vllm serve nvidia/Gemma-4-26B-A4B-NVFP4 "
                      "--kv-cache-memory-bytes 4G --kv-cache-dtype fp8 "
                      "--gpu-memory-utilization 0.1",
                      version="0.33.0")
    new = row(result, "new engine")
    assert new.kv_tokens[0].value is None and new.kv_tokens[1].value is not None
    # The seeded entry has no hidden sizes to count its weights by: the after-ledger is
    # unknown with the reason, never a number.
    assert result.headroom[1].value is None
    assert "weights" in result.headroom[1].confidence
    assert result.verdict == planner.UNKNOWN_VERDICT
    assert result.largest.pool.value is None


@pytest.mark.parametrize(("engine", "command", "message"), [
    ("nemotron-120b", "vllm srve nvidia/x --kv-cache-memory-bytes 8G",
     "the launch command cannot be read: no vLLM launch found"),
    (None, "vllm serve someone/unheard-of-7b --kv-cache-memory-bytes 8G",
     "unknown model someone/unheard-of-7b: someone/unheard-of-7b is not in the seeded table"),
    ("gemma-4-26b", GEMMA_COMMAND + " --kv-cache-dtype bogus",
     "--kv-cache-dtype 'bogus' is not a KV cache dtype vLLM knows"),
    ("gemma-4-26b", GEMMA_COMMAND + " --kv-cache-memory-bytes 1.5G",
     "the launch command cannot be read: --kv-cache-memory-bytes"),
    ("gemma-4-26b", "", "the launch command is empty"),
    ("nobody", GEMMA_COMMAND, "no engine named 'nobody' on this node"),
])
def test_bad_input_gets_one_clear_line_and_no_number(engine, command, message):
    node = seed_node()
    with pytest.raises(PlanError) as error:
        plan_for(node, engine, command, version="0.33.0")
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_other_engine_kinds_are_not_predictable_yet():
    node = seed_node()
    Engine.objects.create(node=node, name="qwen3-1.7b", kind="llamacpp", container_id="q" * 64,
                          container_state="running", phase="ready")
    with pytest.raises(PlanError, match="not predictable for llamacpp yet"):
        plan_for(node, "qwen3-1.7b", "llama-server -m /models/q.gguf")


def test_no_ledger_yet_is_said():
    node = Node.objects.create(name="fresh", mem_total_bytes=TOTAL)
    with pytest.raises(PlanError, match="has no memory ledger yet"):
        plan_for(node, None, GEMMA_COMMAND, version="0.33.0")


def test_fits_with_margin_is_the_prefill_squeeze_rule():
    assert planner.prefill_fits(14 * GIB, 12 * GIB, MARGIN) is True
    assert planner.prefill_fits(14 * GIB, 12 * GIB + 1, MARGIN) is False
    assert planner.prefill_fits(None, 12 * GIB, MARGIN) is None
    assert prefill_margin_bytes() == MARGIN
