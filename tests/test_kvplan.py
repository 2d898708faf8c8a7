"""The model of what a vLLM engine reserves: KV blocks, reported tokens and concurrency per
release (collectors.vllm.kvplan), the pool's size and start-up refusal
(collectors.vllm.poolplan).

The reference figures below were computed by running each release's own
vllm/v1/core/kv_cache_utils.py (kv_cache_planning.py in 0.33) and kv_cache_interface.py on the
same layer specs, from the releases' source distributions: the planner must reproduce them
exactly, integer for integer, where vLLM's arithmetic is integer.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from collectors.meminfo import parse_meminfo
from collectors.modelarch import (
    FULL,
    MAMBA,
    SLIDING,
    Architecture,
    ArchitectureUnknown,
    LayerAttention,
    seeded_architecture,
)
from collectors.vllm import kvplan, poolplan
from collectors.vllm.flags import parse_command_line
from collectors.vllm.kvplan import EngineSettings, FlagRejected, plan_kv, settings_from_config
from collectors.vllm.poolplan import BootMemory, Usage, plan_pool, predict

# The seeded architectures are rows of the model architecture table.
pytestmark = pytest.mark.django_db

GIB = 1024**3
GEMMA = "nvidia/Gemma-4-26B-A4B-NVFP4"
# The seed's engine: a pinned 20 GiB pool, fp8 KV, 131,072-token requests.
SEED = (f"vllm serve {GEMMA} --kv-cache-memory-bytes 21474836480 --kv-cache-dtype fp8 "
        "--max-model-len 131072 --max-num-batched-tokens 8192")
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm_releases"


def gemma_plan(version: str, extra: str = "", pool: int | None = 20 * GIB):
    settings = settings_from_config(parse_command_line(f"{SEED} {extra}"))
    return plan_kv(seeded_architecture(GEMMA), settings, version, pool)


# --- the seed's figures -----------------------------------------------------------------------


def test_seed_pool_is_65536_blocks_of_six_64_kib_groups():
    """25 sliding layers (8 KV heads x 256, fp8: 4,096 B/token) and 5 full layers (2 x 512:
    2,048 B/token). The full layers' block doubles to 32 so both pages are 64 KiB; layers group
    by the smallest kind's count (5): 5 sliding groups + 1 full group of 5 layers, so one block
    id costs 5 x 64 KiB and 20 GiB hold 65,536 blocks."""
    plan = gemma_plan("0.20.1")
    assert plan.kv_bytes_per_token == 25 * 4096 + 5 * 2048
    assert plan.num_blocks == 65536
    assert [(g.spec.kind, g.layers, g.spec.block_size, g.spec.page_bytes) for g in plan.groups] \
        == [(SLIDING, 5, 16, 65536)] * 5 + [(FULL, 5, 32, 65536)]
    assert plan.confidence == "exact"


@pytest.mark.parametrize("version", ["0.20.1", "0.20.2", "0.21.0", "0.23.0", "0.25.1"])
def test_seed_figures_from_0_20_1_to_0_25(version):
    """A request holds cdiv(1024 - 1 + 8192, 16) + 1 = 577 blocks in each sliding group and
    131,072 / 32 = 4,096 in the full one: 65,536 / 6,981 = 9.39 requests; vLLM prints
    int(9.3878 x 131,072) = 1,230,473 tokens, a derived figure, not slots stored."""
    plan = gemma_plan(version)
    assert plan.tokens == 1_230_473
    assert plan.concurrency == pytest.approx(65536 / 6981, rel=1e-12)
    assert f"{plan.concurrency:.2f}" == "9.39"


@pytest.mark.parametrize("version", ["0.19.0", "0.19.1", "0.20.0"])
def test_seed_tokens_before_0_20_1_are_blocks_per_group(version):
    """Same 9.39x, but the token count was blocks // groups x smallest block:
    65,536 // 6 x 16 = 174,752."""
    plan = gemma_plan(version)
    assert plan.tokens == 174_752
    assert f"{plan.concurrency:.2f}" == "9.39"


@pytest.mark.parametrize("version", ["0.26.0", "0.27.1", "0.29.0", "0.31.0", "0.33.0"])
def test_seed_from_0_26_charges_sliding_layers_two_batches_with_async_scheduling(version):
    """Async scheduling (on by default) keeps two batches in flight: a sliding group is charged
    cdiv(1023 + 16,384, 16) + 1 = 1,089 blocks: 65,536 / 9,541 = 6.87x, 900,318 tokens; with
    it off the figures are 0.25's again."""
    plan = gemma_plan(version)
    assert plan.tokens == 900_318
    assert f"{plan.concurrency:.2f}" == "6.87"
    off = gemma_plan(version, "--no-async-scheduling")
    assert off.tokens == 1_230_473
    assert f"{off.concurrency:.2f}" == "9.39"


@pytest.mark.parametrize("version", ["0.19.0", "0.20.1", "0.26.0", "0.33.0"])
def test_seed_with_the_hybrid_manager_off(version):
    """Sliding layers cached as full attention: one group of 30 layers of their own page sizes
    (25 x 64 KiB + 5 x 32 KiB per block of 16): 11,915 blocks, 1.45x, 190,640 tokens."""
    plan = gemma_plan(version, "--disable-hybrid-kv-cache-manager")
    assert (plan.num_blocks, plan.tokens) == (11915, 190_640)
    assert f"{plan.concurrency:.2f}" == "1.45"


@pytest.mark.parametrize(("version", "mnbt", "expected"), [
    ("0.20.1", 2048, ("12.95", 1_697_280)), ("0.20.1", 16384, ("6.87", 900_318)),
    ("0.25.1", 2048, ("12.95", 1_697_280)),
    ("0.26.0", 2048, ("11.50", 1_506_741)), ("0.26.0", 16384, ("4.47", 585_903)),
])
def test_max_num_batched_tokens_moves_the_sliding_charge(version, mnbt, expected):
    plan = gemma_plan(version, f"--max-num-batched-tokens {mnbt}")
    assert (f"{plan.concurrency:.2f}", plan.tokens) == expected


def test_the_window_counts_its_last_token_once():
    """cdiv(window - 1 + tokens, block) + 1: at 8,193 batched tokens 1,023 + 8,193 = 9,216 is
    exactly 576 blocks, so 0.20.1's figures do not move; 0.26 charges 1,023 + 16,386 = 17,409,
    one block more than at 8,192 (as vLLM 0.26.0's own code prints: 899,846 tokens)."""
    assert gemma_plan("0.20.1", "--max-num-batched-tokens 8193").tokens == 1_230_473
    assert gemma_plan("0.26.0", "--max-num-batched-tokens 8193").tokens == 899_846


def test_block_size_barely_moves_the_figures():
    plan = gemma_plan("0.20.1", "--block-size 32")
    assert (plan.num_blocks, plan.tokens, f"{plan.concurrency:.2f}") == (32768, 1_229_592, "9.38")


def test_concurrency_for_a_shorter_request_length():
    """32,768-token requests on 0.26: 5 x 1,089 sliding + 32,768 / 32 full blocks each."""
    plan = gemma_plan("0.26.0")
    assert plan.concurrency_at(32768) == pytest.approx(65536 / (5 * 1089 + 1024))
    assert plan.concurrency_at(131072) == pytest.approx(plan.concurrency)


def test_tensor_parallelism_splits_kv_heads():
    llama = seeded_architecture("meta-llama/Llama-3.1-8B-Instruct")
    one = plan_kv(llama, EngineSettings(max_model_len=131072), "0.26.0", 20 * GIB)
    two = plan_kv(llama, EngineSettings(max_model_len=131072, tensor_parallel_size=2), "0.26.0",
                  20 * GIB)
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.num_blocks == 2 * one.num_blocks


# --- other layouts, as each release's own code computes them -----------------------------------

_S = LayerAttention(SLIDING, 8, 128, 128, 4096)
_F = LayerAttention(FULL, 8, 128, 128)
UNEVEN = Architecture("test", (_S,) * 14 + (_F,) * 10, "a test layout", dtype="bfloat16",
                      max_position_embeddings=131072)
_G3S = LayerAttention(SLIDING, 16, 128, 128, 1024)
_G3F = LayerAttention(FULL, 16, 128, 128)
GEMMA3_LIKE = Architecture("gemma3_text", ((_G3S,) * 5 + (_G3F,)) * 10 + (_G3S, _G3S),
                           "a test layout", dtype="bfloat16", max_position_embeddings=131072)

# (architecture, settings) -> {first release of a range: (blocks, tokens, "concurrency")}
REFERENCE = {
    "gpt-oss-120b": (
        lambda: seeded_architecture("openai/gpt-oss-120b"), EngineSettings(max_model_len=131072),
        {"0.10.1": (36408, 291_264, "4.18"), "0.20.1": (36408, 547_695, "4.18"),
         "0.26.0": (36408, 517_297, "3.95")}),
    "llama-3.1-8b": (
        lambda: seeded_architecture("meta-llama/Llama-3.1-8B-Instruct"),
        EngineSettings(max_model_len=131072),
        {"0.9.2": (10240, 163_840, "1.25"), "0.33.0": (10240, 163_840, "1.25")}),
    "llama-3.1-8b tp 2 fp8": (
        lambda: seeded_architecture("meta-llama/Llama-3.1-8B-Instruct"),
        EngineSettings(max_model_len=131072, tensor_parallel_size=2, kv_cache_dtype="fp8"),
        {"0.9.2": (40960, 655_360, "5.00"), "0.26.0": (40960, 655_360, "5.00")}),
    # 14 sliding + 10 full: groups of 10 (3 groups) until 0.17, of 14 with 4 padding layers
    # (2 groups) from 0.18, where 14 < 1.5 x 10.
    "14 sliding + 10 full": (
        lambda: UNEVEN, EngineSettings(max_model_len=131072),
        {"0.9.2": (32768, 174_752, "3.37"), "0.17.1": (32768, 174_752, "3.37"),
         "0.18.0": (23405, 187_232, "2.61"), "0.20.1": (23405, 342_343, "2.61"),
         "0.26.0": (23405, 323_840, "2.47")}),
    # 52 sliding + 10 full: 6 sliding groups of 10 (8 padding layers) and 1 full group.
    "gemma3-like 62 layers": (
        lambda: GEMMA3_LIKE, EngineSettings(max_model_len=131072),
        {"0.9.2": (16384, 37_440, "1.41"), "0.20.1": (16384, 184_270, "1.41"),
         "0.26.0": (16384, 145_829, "1.11")}),
}


@pytest.mark.parametrize("name", list(REFERENCE))
def test_other_layouts_match_each_releases_own_arithmetic(name):
    make, settings, figures = REFERENCE[name]
    arch = make()
    for version, (blocks, tokens, concurrency) in figures.items():
        plan = plan_kv(arch, settings, version, 20 * GIB)
        assert (plan.num_blocks, plan.tokens, f"{plan.concurrency:.2f}") \
            == (blocks, tokens, concurrency), version


def test_padding_layers_are_named():
    plan = plan_kv(GEMMA3_LIKE, EngineSettings(max_model_len=131072), "0.26.0", 20 * GIB)
    assert len(plan.groups) == 7
    assert "7 groups of 10 layers (8 padding)" in plan.basis


# --- what vLLM refuses ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.12.0", "0.18.1"])
def test_gemma_4_on_a_release_without_it_is_refused_not_sized(version):
    plan = gemma_plan(version)
    assert plan.num_blocks is None and plan.tokens is None and plan.concurrency is None
    assert "does not know this architecture" in plan.refusal
    assert plan.confidence.startswith("unknown — the engine would not start")


def test_hybrid_layers_of_unequal_pages_before_0_12_are_refused():
    layout = Architecture("test", (LayerAttention(SLIDING, 8, 256, 256, 1024),) * 5
                          + (LayerAttention(FULL, 2, 512, 512),), "a test layout",
                          max_position_embeddings=8192)
    old = plan_kv(layout, EngineSettings(kv_cache_dtype="fp8"), "0.11.2", 4 * GIB)
    assert old.num_blocks is None and "NotImplementedError" in old.refusal
    new = plan_kv(layout, EngineSettings(kv_cache_dtype="fp8"), "0.12.0", 4 * GIB)
    assert new.num_blocks is not None and new.refusal is None


def test_which_layers_count_as_one_kind_changed_in_0_10_1():
    """Hybrid manager off, sliding 4 x 256 and full 2 x 512 layers: the same 64 KiB page but
    different shapes. 0.10.0 grouped by page (type_id): one group, 5,461 blocks; 0.10.1 compares
    whole specs and cannot put them in one group ("failed to convert the KV cache specs to one
    unified type"); 0.11.0 can (UniformTypeKVCacheSpecs)."""
    layout = Architecture("test", ((LayerAttention(SLIDING, 4, 256, 256, 128),) * 3
                                   + (LayerAttention(FULL, 2, 512, 512),)) * 3,
                          "a test layout", dtype="bfloat16", max_position_embeddings=131072)
    settings = EngineSettings(max_model_len=8192, disable_hybrid_kv_cache_manager=True)
    for version, figures in (("0.10.0", (5461, 87_376, "10.67")), ("0.10.1", None),
                             ("0.11.0", (5461, 87_376, "10.67"))):
        plan = plan_kv(layout, settings, version, 4 * GIB)
        if figures is None:
            assert plan.num_blocks is None and "cannot put layers" in plan.refusal
        else:
            assert (plan.num_blocks, plan.tokens, f"{plan.concurrency:.2f}") == figures, version


def test_a_request_that_does_not_fit_the_pool_is_refused():
    plan = gemma_plan("0.26.0", pool=1 * GIB)
    assert plan.num_blocks is None
    assert "one request of 131,072 tokens needs 3,126,394,880 bytes (2.91 GiB)" in plan.refusal
    # 9,541 blocks of 5 x 64 KiB.


def test_from_0_29_one_block_is_kept_back_from_the_fit_check():
    exactly_one_request = 9541 * 5 * 65536
    assert gemma_plan("0.28.0", pool=exactly_one_request).num_blocks == 9541
    refused = gemma_plan("0.29.0", pool=exactly_one_request)
    assert refused.num_blocks is None and "less the one block vLLM keeps back" in refused.refusal


def test_fit_check_counted_only_the_first_group_from_0_14_to_0_18():
    """0.14-0.18 checked one request against the first group's blocks only (the sliding one
    here): 2 GiB starts on 0.18.1 (2,340 blocks, 0.26x) and is refused from 0.19.0, which
    counts every group (7.66 GiB needed)."""
    settings = EngineSettings(max_model_len=131072)
    starts = plan_kv(UNEVEN, settings, "0.18.1", 2 * GIB)
    assert (starts.num_blocks, starts.tokens) == (2340, 18_720)
    refused = plan_kv(UNEVEN, settings, "0.19.0", 2 * GIB)
    assert refused.num_blocks is None and "(7.66 GiB)" in refused.refusal


def test_no_room_left_is_refused():
    plan = gemma_plan("0.26.0", pool=0)
    assert plan.num_blocks is None and "No available memory" in plan.refusal


# --- flags the engine rejects --------------------------------------------------------------------


@pytest.mark.parametrize(("command", "version", "message"), [
    (SEED, "0.10.1", "vLLM 0.10.1 has no --kv-cache-memory-bytes (added in 0.10.2)"),
    (f"vllm serve {GEMMA} --kv-cache-dtype nvfp4", "0.19.1",
     "vLLM 0.19.1 does not accept --kv-cache-dtype nvfp4 (added in 0.20.0)"),
    (f"vllm serve {GEMMA} --kv-cache-dtype fp4", "0.26.0",
     "--kv-cache-dtype 'fp4' is not a KV cache dtype vLLM knows"),
    (f"vllm serve {GEMMA} --swap-space 4", "0.26.0",
     "vLLM 0.26.0 has no --swap-space (removed in 0.18.1, last in 0.17.1)"),
    (f"vllm serve {GEMMA} --kv-cache-dtype fp8 --max-model-len 262144", "0.26.0",
     "--max-model-len 262,144 is longer than the model's 131,072 positions"),
    (f"vllm serve {GEMMA} --kv-cache-dtype fp8 --tensor-parallel-size 3", "0.26.0",
     "--tensor-parallel-size 3 does not divide the model's 8 KV heads"),
    (f"vllm serve {GEMMA} --tensor-parallel-size two", "0.26.0",
     "--tensor-parallel-size: 'two' is not an integer"),
])
def test_flags_a_release_rejects_get_one_clear_line(command, version, message):
    with pytest.raises(FlagRejected) as raised:
        settings = settings_from_config(parse_command_line(command))
        plan_kv(seeded_architecture(GEMMA), settings, version, 20 * GIB)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_long_max_model_len_is_accepted_with_vllms_override():
    settings = settings_from_config(parse_command_line(
        f"vllm serve {GEMMA} --kv-cache-dtype fp8 --max-model-len 262144"))
    plan = plan_kv(seeded_architecture(GEMMA), settings, "0.26.0", 20 * GIB,
                   env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert plan.max_model_len == 262144 and plan.num_blocks == 65536


def test_flag_first_releases_agree_with_the_release_fixtures():
    """Each flag of FLAG_FIRST_RELEASE is declared by the fixture of its minor release and by
    none of the older fixtures (one fixture per minor, extracted from vLLM's parsers)."""
    declared: dict[str, set[str]] = {}
    for path in FIXTURES.glob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        declared[data["version"]] = {flag["name"].lstrip("-") for flag in data["flags"]}
    minor = lambda version: tuple(int(p) for p in version.split(".")[:2])  # noqa: E731
    for name, first in kvplan.FLAG_FIRST_RELEASE.items():
        for version, names in declared.items():
            if minor(version) > minor(first):
                assert name in names, (name, version)
            elif minor(version) < minor(first):
                assert name not in names, (name, version)


def test_every_rule_change_names_a_release_read_and_its_file():
    for change in kvplan.RULE_CHANGES:
        assert change.since in kvplan.RELEASES_READ
        assert re.search(r"vllm/|\.py", change.where), change


# --- what cannot be predicted says so ------------------------------------------------------------


@pytest.mark.parametrize(("version", "reason"), [
    (None, "vLLM version is not known"),
    ("0.8.5.post1", "older than 0.9.2"),
])
def test_unknown_or_unmodelled_versions_give_no_number(version, reason):
    plan = gemma_plan(version)
    assert plan.tokens is None and plan.concurrency is None and plan.num_blocks is None
    assert plan.confidence.startswith("unknown — ") and reason in plan.confidence


def test_newer_and_pre_releases_are_estimates_on_the_nearest_rules():
    newer = gemma_plan("0.34.0")
    assert newer.tokens == 900_318 and newer.confidence == "estimate"
    assert "newest release read" in newer.basis
    pre = gemma_plan("0.26.0rc1")
    assert pre.confidence == "estimate" and "pre-release" in pre.basis


@pytest.mark.parametrize(("extra", "reason"), [
    ("--max-model-len -1", "--max-model-len auto"),
    ("--pipeline-parallel-size 2", "pipeline parallelism"),
    ("--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 4}'",
     "speculative drafter"),
    ("--kv-transfer-config '{}'", "KV connector"),
    ("--disable-sliding-window", "--disable-sliding-window"),
])
def test_settings_the_planner_does_not_model_are_unknown(extra, reason):
    plan = gemma_plan("0.26.0", extra)
    assert plan.tokens is None and reason in plan.confidence


def test_mamba_layers_are_unknown_with_what_vllm_does():
    hybrid = Architecture("nemotron_h", (LayerAttention(MAMBA),) * 3
                          + (LayerAttention(FULL, 8, 128, 128),), "a test layout",
                          max_position_embeddings=8192)
    plan = plan_kv(hybrid, EngineSettings(), "0.26.0", 4 * GIB)
    assert plan.tokens is None
    assert "one fixed-size state per request" in plan.confidence


def test_kv_layouts_not_modelled_are_unknown():
    settings = settings_from_config(parse_command_line(
        f"vllm serve {GEMMA} --kv-cache-dtype turboquant_k8v4"))
    plan = plan_kv(seeded_architecture(GEMMA), settings, "0.26.0", 20 * GIB)
    assert plan.tokens is None and "turboquant_k8v4 is not modelled" in plan.confidence


def test_nvfp4_kv_packs_fp4_values_and_fp8_scales():
    """Per head and token: 128 / 2 + 128 / 16 = 72 bytes for K and as many for V. Llama 3.1 8B
    (full attention only) from 0.20; Gemma 4's sliding layers are packed from 0.21."""
    llama = seeded_architecture("meta-llama/Llama-3.1-8B-Instruct")
    settings = EngineSettings(max_model_len=131072, kv_cache_dtype="nvfp4")
    for version in ("0.20.1", "0.26.0", "0.33.0"):
        plan = plan_kv(llama, settings, version, 20 * GIB)
        assert plan.kv_bytes_per_token == 32 * 8 * 2 * 72
        assert (plan.num_blocks, plan.tokens, f"{plan.concurrency:.2f}") == \
            (36408, 582_528, "4.44"), version
    assert gemma_plan("0.20.1", "--kv-cache-dtype nvfp4").tokens is None
    assert "does not pack NVFP4 pages of sliding-window layers" in \
        gemma_plan("0.20.1", "--kv-cache-dtype nvfp4").confidence
    assert gemma_plan("0.21.0", "--kv-cache-dtype nvfp4").tokens == 2_187_499
    assert gemma_plan("0.26.0", "--kv-cache-dtype nvfp4").tokens == 1_600_559


def test_per_token_head_scales_add_to_each_page():
    """One float32 scale per token and head for K and for V: 8 bytes more per head."""
    llama = seeded_architecture("meta-llama/Llama-3.1-8B-Instruct")
    plan = plan_kv(llama, EngineSettings(max_model_len=131072, kv_cache_dtype="fp8_per_token_head"),
                   "0.26.0", 20 * GIB)
    assert plan.kv_bytes_per_token == 32 * 8 * (256 + 8)
    assert (plan.num_blocks, plan.tokens, f"{plan.concurrency:.2f}") == (19859, 317_744, "2.42")


def test_pages_that_do_not_divide_are_refused_then_padded():
    """Gemma 4 with int8 per-token-head scales: 33,024- and 66,560-byte pages. vLLM refuses
    before 0.26, pads them for some attention backends in 0.26-0.28 (unknown here) and pads
    every non-MLA layer from 0.29."""
    extra = "--kv-cache-dtype int8_per_token_head"
    refused = gemma_plan("0.21.0", extra)
    assert refused.num_blocks is None and "NotImplementedError" in refused.refusal
    backend = gemma_plan("0.26.0", extra)
    assert backend.num_blocks is None and "index pages by block stride" in backend.confidence
    padded = gemma_plan("0.33.0", extra)
    assert (padded.num_blocks, padded.tokens, f"{padded.concurrency:.2f}") == \
        (64527, 620_201, "4.73")
    # With the smaller page first the padded page sets the block's cost: the same figures.
    full_first = Architecture("test", ((LayerAttention(FULL, 2, 512, 512),)
                                       + (LayerAttention(SLIDING, 8, 256, 256, 1024),) * 5) * 5,
                              "a test layout", dtype="bfloat16", max_position_embeddings=131072)
    settings = EngineSettings(max_model_len=131072, kv_cache_dtype="int8_per_token_head")
    plan = plan_kv(full_first, settings, "0.29.0", 20 * GIB)
    assert (plan.num_blocks, plan.tokens) == (64527, 620_201)


def test_hybrid_off_in_0_20_dropped_the_scales_of_sliding_layers():
    """0.20 rebuilt sliding layers as full attention without their per-token-head mode, so
    their pages lost the scales: 11,907 blocks; 0.21 keeps them: 11,740."""
    extra = "--kv-cache-dtype int8_per_token_head --disable-hybrid-kv-cache-manager"
    assert (gemma_plan("0.20.1", extra).num_blocks, gemma_plan("0.20.1", extra).tokens) == \
        (11907, 190_512)
    assert (gemma_plan("0.21.0", extra).num_blocks, gemma_plan("0.21.0", extra).tokens) == \
        (11740, 187_840)


def test_auto_kv_dtype_of_a_seeded_modelopt_checkpoint_is_unknown():
    """Whether nvidia/Gemma-4-26B-A4B-NVFP4's config.json declares an fp8 KV cache is not
    seeded; vLLM would take it from there with --kv-cache-dtype auto."""
    settings = settings_from_config(parse_command_line(f"vllm serve {GEMMA}"))
    plan = plan_kv(seeded_architecture(GEMMA), settings, "0.26.0", 20 * GIB)
    assert plan.tokens is None and "does not say it" in plan.confidence


def test_a_checkpoints_declared_kv_quantisation_is_used_from_0_14():
    declared = Architecture("llama", (_F,) * 4, "a test layout", dtype="bfloat16",
                            max_position_embeddings=8192, quant_method="modelopt",
                            kv_cache_quant_algo="fp8")
    bf16 = plan_kv(declared, EngineSettings(kv_cache_dtype="bfloat16"), "0.26.0", GIB)
    auto = plan_kv(declared, EngineSettings(), "0.26.0", GIB)
    assert auto.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert "kv_cache_quant_algo fp8_e4m3" in auto.basis
    old = plan_kv(declared, EngineSettings(), "0.13.0", GIB)
    assert old.tokens is None and "not modelled" in old.confidence


def test_a_compressed_tensors_kv_scheme_makes_the_cache_fp8_release_by_release():
    """0.16-0.21 force fp8 whatever the flag says; from 0.22 only under auto; before 0.16 how
    the scheme is read is not modelled."""
    declared = Architecture("llama", (_F,) * 4, "a test layout", dtype="bfloat16",
                            max_position_embeddings=8192, quant_method="compressed-tensors",
                            kv_cache_quant_algo="fp8")
    explicit = EngineSettings(kv_cache_dtype="bfloat16")
    fp8 = 4 * 8 * 256  # 4 layers x 8 KV heads x (128 + 128), one byte a value
    assert plan_kv(declared, explicit, "0.21.0", GIB).kv_bytes_per_token == fp8
    assert plan_kv(declared, explicit, "0.22.0", GIB).kv_bytes_per_token == 2 * fp8
    assert plan_kv(declared, EngineSettings(), "0.22.0", GIB).kv_bytes_per_token == fp8
    old = plan_kv(declared, EngineSettings(), "0.14.1", GIB)
    assert old.tokens is None and "KV cache scheme" in old.confidence


def test_a_default_length_vllm_may_stretch_is_an_estimate():
    stretched = Architecture("qwen3", (_F,) * 4, "a test layout", dtype="bfloat16",
                             max_position_embeddings=32768, rope_scaled=True)
    plan = plan_kv(stretched, EngineSettings(), "0.26.0", GIB)
    assert plan.confidence == "estimate" and "rope_scaling factor" in plan.basis
    pinned = plan_kv(stretched, EngineSettings(max_model_len=32768), "0.26.0", GIB)
    assert pinned.confidence == "exact"


def test_an_unknown_pool_gives_per_token_bytes_but_no_capacity():
    plan = gemma_plan("0.26.0", pool=None)
    assert plan.kv_bytes_per_token == 112_640 and plan.tokens is None
    assert plan.confidence == "unknown — the pool's size is not known"


def test_num_gpu_blocks_override_sets_the_blocks_exactly():
    plan = gemma_plan("0.26.0", "--num-gpu-blocks-override 10000", pool=None)
    assert plan.num_blocks == 10000 and plan.pool_bytes == 10000 * 5 * 65536
    too_few = gemma_plan("0.26.0", "--num-gpu-blocks-override 1000", pool=None)
    assert too_few.num_blocks is None and "one request of 131,072 tokens" in too_few.refusal


# --- the pool ------------------------------------------------------------------------------------

GB10_TOTAL = int(119.7 * GIB)


def pool_for(command: str, version: str, memory: BootMemory, usage: Usage | None = None):
    return plan_pool(settings_from_config(parse_command_line(command)), version, memory, usage)


def test_a_pinned_pool_is_exact():
    pool = pool_for(SEED + " --gpu-memory-utilization 0.3", "0.26.0",
                    BootMemory(GB10_TOTAL, 60 * GIB))
    assert (pool.mode, pool.bytes, pool.confidence) == ("pinned", 20 * GIB, "exact")


@pytest.mark.parametrize(("version", "utilization"), [("0.19.1", 0.9), ("0.20.0", 0.92)])
def test_a_pinned_pool_still_needs_the_default_utilization_free_at_boot(version, utilization):
    """vLLM checks free memory against --gpu-memory-utilization x total even when the pool is
    pinned: next to another engine, the default (0.9, 0.92 from 0.20) refuses to start."""
    pool = pool_for(SEED, version, BootMemory(GB10_TOTAL, 60 * GIB))
    assert pool.bytes is None and pool.utilization == utilization
    assert "less than --gpu-memory-utilization" in pool.refusal
    assert "desired GPU memory utilization" in pool.refusal


def test_the_refusal_boundary_is_vllms_rounded_up_request():
    """From 0.14 requested = ceil(total x utilization); free equal to it starts, a byte less
    refuses."""
    settings = EngineSettings(gpu_memory_utilization=0.3, kv_cache_memory_bytes=GIB)
    requested = -(-GB10_TOTAL * 3 // 10)
    assert plan_pool(settings, "0.26.0", BootMemory(GB10_TOTAL, requested)).refusal is None
    assert plan_pool(settings, "0.26.0", BootMemory(GB10_TOTAL, requested - 1)).refusal


# The seed observed util 0.35 -> KV 40.5 GiB and util 0.30 -> 13.8 GiB on the same GB10 (total
# 119.7 GiB): 0.05 x total is 6 GiB, yet the pools differ by 26.7 GiB. vLLM takes out of
# utilization x total what the start-up took, measured as the fall of free memory from the boot
# snapshot. The same engine takes 22.11 GiB (weights 15.5, activation peak 4.6, non-torch 1.2,
# CUDA graphs 0.81): booted on a settled node (0.30: 60 GiB free throughout) it keeps
# 35.91 - 22.11 = 13.8 GiB; booted while 20.7 GiB were still being handed back (0.35: the
# previous instance's memory, or a page-cache drop, still being released after the boot
# snapshot at 45 GiB free, settling at 65.7 GiB) that release is credited to the pool:
# 41.9 - 22.11 + 20.7 = 40.5 GiB.
SEED_USAGE = Usage(weights_bytes=int(15.5 * GIB), activation_peak_bytes=int(4.6 * GIB),
                   non_torch_bytes=int(1.2 * GIB), cudagraph_bytes=int(0.81 * GIB))


def test_profiled_pools_reproduce_the_seeds_0_35_and_0_30_shape():
    settled = pool_for(f"vllm serve {GEMMA} --gpu-memory-utilization 0.30", "0.26.0",
                       BootMemory(GB10_TOTAL, 60 * GIB), SEED_USAGE)
    releasing = pool_for(f"vllm serve {GEMMA} --gpu-memory-utilization 0.35", "0.26.0",
                         BootMemory(GB10_TOTAL, 45 * GIB, int(65.7 * GIB)), SEED_USAGE)
    taken = (SEED_USAGE.weights_bytes + SEED_USAGE.activation_peak_bytes
             + SEED_USAGE.non_torch_bytes + SEED_USAGE.cudagraph_bytes)
    assert settled.bytes == math.ceil(GB10_TOTAL * 0.30) - taken  # vLLM rounds the request up
    assert settled.bytes / GIB == pytest.approx(13.8, rel=0.01)
    assert releasing.bytes / GIB == pytest.approx(40.5, rel=0.01)
    assert settled.mode == releasing.mode == "profiled"
    assert settled.confidence == releasing.confidence == "estimate"
    assert "20.70 GiB handed back by others during the start" in releasing.basis


def test_free_memory_at_boot_moves_a_profiled_pool():
    """Same flags, same node end state: every GiB still held at boot (and released during the
    start) is a GiB more pool; the refusal comes once free at boot falls below 0.35 x total."""
    command = f"vllm serve {GEMMA} --gpu-memory-utilization 0.35"
    pools = [pool_for(command, "0.26.0", BootMemory(GB10_TOTAL, free * GIB, 66 * GIB),
                      SEED_USAGE).bytes for free in (66, 56, 46)]
    assert pools[1] - pools[0] == pools[2] - pools[1] == 10 * GIB
    refused = pool_for(command, "0.26.0", BootMemory(GB10_TOTAL, 41 * GIB, 66 * GIB), SEED_USAGE)
    assert refused.bytes is None and "refuses to start" in refused.refusal


def test_cuda_graph_estimate_is_taken_out_from_0_20():
    command = f"vllm serve {GEMMA} --gpu-memory-utilization 0.5"
    memory = BootMemory(GB10_TOTAL, 100 * GIB)
    before = pool_for(command, "0.19.1", memory, SEED_USAGE).bytes
    after = pool_for(command, "0.20.0", memory, SEED_USAGE).bytes
    assert before - after == SEED_USAGE.cudagraph_bytes
    eager = pool_for(command + " --enforce-eager", "0.20.0", memory, SEED_USAGE).bytes
    assert eager == before
    opted_in = plan_pool(settings_from_config(parse_command_line(command)), "0.19.1", memory,
                         SEED_USAGE, env={"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "1"})
    assert opted_in.bytes == after


def test_unknown_parts_of_a_profiled_pool_are_named():
    pool = pool_for(f"vllm serve {GEMMA} --gpu-memory-utilization 0.5", "0.26.0",
                    BootMemory(GB10_TOTAL, 100 * GIB), Usage(weights_bytes=15 * GIB))
    assert pool.confidence == "estimate"
    assert ("activation peak and non-torch memory and the CUDA graph estimate not known, "
            "counted as 0") in pool.basis
    no_weights = pool_for(f"vllm serve {GEMMA}", "0.26.0", BootMemory(GB10_TOTAL, 115 * GIB))
    assert no_weights.bytes is None and "needs the weights" in no_weights.confidence


def test_the_multimodal_reservation_comes_out_of_a_pinned_pool_from_0_25():
    extra = " --mm-ipc-gpu-memory-gb 2 --gpu-memory-utilization 0.3"
    memory = BootMemory(GB10_TOTAL, 60 * GIB)
    assert pool_for(SEED + extra, "0.25.0", memory).bytes == 18 * GIB
    profiled = f"vllm serve {GEMMA} --gpu-memory-utilization 0.3"
    assert pool_for(profiled, "0.25.0", memory, SEED_USAGE).bytes \
        - pool_for(profiled + " --mm-ipc-gpu-memory-gb 2", "0.25.0", memory,
                   SEED_USAGE).bytes == 2 * GIB
    with pytest.raises(FlagRejected, match="added in 0.25.0"):
        pool_for(SEED + extra, "0.24.0", memory)


MEMINFO = """MemTotal:       125513728 kB
MemFree:         31457280 kB
MemAvailable:    94371840 kB
Buffers:            10240 kB
Cached:          62914560 kB
SReclaimable:      524288 kB
Shmem:              20480 kB
Dirty:                  0 kB
SwapTotal:              0 kB
SwapFree:               0 kB
"""


def test_page_cache_counts_as_used_at_boot_before_0_20():
    """30 GiB free, 90 GiB available (60 GiB of page cache): 0.19 reads MemFree and refuses
    --gpu-memory-utilization 0.35 (41.9 GiB); 0.20 reads MemAvailable and starts. Dropping
    the page cache is what lets the older release start."""
    meminfo = parse_meminfo(MEMINFO)
    command = SEED + " --gpu-memory-utilization 0.35"
    for version, starts in (("0.19.1", False), ("0.20.0", True)):
        free = poolplan.free_at_boot_from_meminfo(meminfo, version)
        pool = pool_for(command, version, BootMemory(GB10_TOTAL, free.bytes))
        assert (pool.refusal is None) is starts, version
    assert "MemFree 30.00 GiB" in poolplan.free_at_boot_from_meminfo(meminfo, "0.19.1").basis


# --- one engine, end to end ----------------------------------------------------------------------


def test_predict_the_seeds_engine():
    prediction = predict("vllm", "0.26.0", parse_command_line(SEED + " --gpu-memory-utilization "
                                                               "0.3"),
                         seeded_architecture(GEMMA), BootMemory(GB10_TOTAL, 60 * GIB))
    assert prediction.pool.bytes == 20 * GIB and prediction.pool.confidence == "exact"
    assert prediction.kv.tokens == 900_318 and prediction.kv.confidence == "exact"
    assert prediction.prefill.bytes is None
    assert "hidden sizes are not known" in prediction.prefill.confidence


def test_predict_a_profiled_engine_from_its_checkpoint(tmp_path):
    """gpt-oss-120b's weights from its safetensors, its activation peak from the prefill
    estimate: the pool and everything after it are estimates."""
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 4096)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 1024)
    prediction = predict("vllm", "0.26.0",
                         parse_command_line("vllm serve openai/gpt-oss-120b "
                                            "--gpu-memory-utilization 0.5"),
                         seeded_architecture("openai/gpt-oss-120b"),
                         BootMemory(GB10_TOTAL, 100 * GIB), model_dir=tmp_path)
    assert prediction.weights.bytes == 5120
    # 8,192 tokens x (4 x 2,880 + 2 x 4 x 2,880) x 2 bytes (modelconfig's estimate).
    assert prediction.prefill.bytes == 8192 * (4 * 2880 + 2 * 4 * 2880) * 2
    assert prediction.pool.confidence == prediction.kv.confidence == "estimate"
    assert prediction.pool.bytes == -(-GB10_TOTAL // 2) - 5120 - prediction.prefill.bytes \
        - 0  # non-torch and CUDA graphs not known: counted as 0 and said so
    assert prediction.kv.tokens is not None


def test_predict_an_unknown_model_or_kind_gives_reasons_not_numbers():
    try:
        seeded_architecture("someone/unheard-of-7b")
    except ArchitectureUnknown as unknown:
        prediction = predict("vllm", "0.26.0", parse_command_line(SEED + " --gpu-memory-"
                                                                   "utilization 0.3"),
                             unknown, BootMemory(GB10_TOTAL, 60 * GIB))
    assert prediction.pool.bytes == 20 * GIB  # a pinned pool needs no architecture
    assert prediction.kv.tokens is None
    assert "someone/unheard-of-7b is not in the seeded table" in prediction.kv.confidence
    other = predict("ollama", None, EngineSettings(), seeded_architecture(GEMMA),
                    BootMemory(GB10_TOTAL))
    assert other.pool is None and other.kv.tokens is None
    assert "only vLLM's KV arithmetic is modelled" in other.kv.confidence
