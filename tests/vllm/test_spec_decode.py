"""Speculative decoding per engine: acceptance and tokens per step from the engine's own counters
(vLLM 0.33's ``SpecDecodingProm``, vllm/v1/spec_decode/metrics.py), over each interval, never
across a counter reset, and told on the card and page ("not speculative" without it)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from collectors.enginecard import engine_card
from collectors.models import Engine, EngineMetric, EngineReading
from collectors.readings import Sample, engine_readings
from collectors.vllm.flags import parse_command_line
from collectors.vllm.metrics import parse_engines
from collectors.vllm.rates import Observation, compute_rates
from collectors.vllm.specdecode import speculative_settings

LABELS = 'engine="0",model_name="gemma"'


def _exposition(drafts: int, drafted: int, accepted: int, per_position: list[int],
                created: float = 1.7e9) -> str:
    lines = [f"vllm:num_requests_running{{{LABELS}}} 1.0"]
    for name, value in (("drafts", drafts), ("draft_tokens", drafted),
                        ("accepted_tokens", accepted)):
        lines += [f"# TYPE vllm:spec_decode_num_{name} counter",
                  f"vllm:spec_decode_num_{name}_total{{{LABELS}}} {value}.0",
                  f"vllm:spec_decode_num_{name}_created{{{LABELS}}} {created}"]
    lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
    for position, value in enumerate(per_position):
        lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LABELS},'
                     f'position="{position}"}} {value}.0')
    return "\n".join(lines) + "\n"


def _rates(before: str, after: str, seconds: float = 5.0):
    return compute_rates(Observation(parse_engines(before)[0], 100.0),
                         Observation(parse_engines(after)[0], 100.0 + seconds))


def test_acceptance_and_tokens_per_step_come_from_the_intervals_counts():
    # 100 drafts of 4 tokens in the interval, 297 of the 400 accepted: 74.25 %, 3.97 per step.
    rates = _rates(_exposition(50, 200, 150, [50, 45, 35, 20]),
                   _exposition(150, 600, 447, [150, 140, 100, 57]))

    assert rates.spec_decode_acceptance_rate == pytest.approx(297 / 400)
    assert rates.spec_decode_mean_acceptance_length == pytest.approx(1 + 297 / 100)
    assert rates.spec_decode_position_acceptance == pytest.approx((1.0, 0.95, 0.65, 0.37))


def test_no_rate_across_a_counter_reset():
    after_restart = _rates(_exposition(500, 2000, 1500, [500, 450, 350, 200]),
                           _exposition(700, 2800, 1600, [100, 90, 70, 40]))

    assert after_restart.restarted
    assert "draft position 0 went down" in after_restart.reason
    assert after_restart.spec_decode_acceptance_rate is None
    assert after_restart.spec_decode_mean_acceptance_length is None


def test_an_interval_without_a_draft_has_no_acceptance_not_0():
    idle = _rates(_exposition(50, 200, 150, [50, 45, 35, 20]),
                  _exposition(50, 200, 150, [50, 45, 35, 20]))

    assert not idle.restarted
    assert idle.spec_decode_acceptance_rate is None
    assert idle.spec_decode_position_acceptance is None


@pytest.mark.parametrize(("command", "expected"), [
    ("vllm serve org/m --speculative-config '{\"method\":\"eagle\",\"num_speculative_tokens\":4}'",
     ("eagle", None, 4)),
    ("vllm serve org/m --speculative-config.method mtp "
     "--speculative-config.num_speculative_tokens 2", ("mtp", None, 2)),
    ("vllm serve org/m -sc '{\"model\": \"org/draft\", \"num_speculative_tokens\": 5}'",
     (None, "org/draft", 5)),
    # 0.6-0.7 (vllm/engine/arg_utils.py of 0.6.6): its own flags.
    ("vllm serve org/m --speculative-model org/draft --num-speculative-tokens 3",
     (None, "org/draft", 3)),
])
def test_the_settings_come_from_each_way_vllm_takes_them(command, expected):
    settings = speculative_settings(parse_command_line(command).as_dict())

    assert (settings.method, settings.model, settings.num_speculative_tokens) == expected


def test_without_speculative_decoding_there_are_no_settings():
    assert speculative_settings(parse_command_line("vllm serve org/m").as_dict()) is None


def _engine(node, command: str | list[str], *, snapshot: dict, rates: dict) -> Engine:
    return Engine.objects.create(
        node=node, name="gemma", container_id="s" * 64, container_state="running",
        phase="ready", config=parse_command_line(command).as_dict(),
        metrics={"snapshot": {"model_name": "gemma", **snapshot}}, rates=rates,
    )


SPECULATIVE = ["vllm", "serve", "org/m", "--speculative-config",
               '{"method": "eagle", "num_speculative_tokens": 4}']
COUNTERS = {"spec_decode_drafts_total": 100, "spec_decode_draft_tokens_total": 400,
            "spec_decode_accepted_tokens_total": 297}


def test_card_and_page_show_acceptance_tokens_per_step_method_and_draft_length(admin_client,
                                                                              node):
    _engine(node, SPECULATIVE, snapshot=COUNTERS, rates={
        "spec_decode_acceptance_rate": 0.743, "spec_decode_mean_acceptance_length": 3.22,
        "spec_decode_position_acceptance": [0.95, 0.8, 0.7, 0.5]})

    card = engine_card(Engine.objects.get(name="gemma"))
    page = admin_client.get("/nodes/spark-a/engines/gemma/").content.decode()
    cards = admin_client.get("/nodes/spark-a/").content.decode()

    text = "acceptance 74.3 %, 3.2 tokens per step, method eagle, 4 speculative tokens"
    assert card["spec_decode"]["text"] == text
    assert text in page and "by draft position: 95.0 %, 80.0 %, 70.0 %, 50.0 %" in page
    assert text in cards


def test_an_engine_without_it_is_not_speculative_never_0(admin_client, node):
    _engine(node, "vllm serve org/m", snapshot={}, rates={})

    page = admin_client.get("/nodes/spark-a/engines/gemma/").content.decode()

    assert '<dd data-field="spec-decode">not speculative</dd>' in page
    assert "0.0 %" not in page


def test_a_speculative_engine_that_drafted_nothing_yet_has_no_acceptance(node):
    engine = _engine(node, SPECULATIVE, snapshot=COUNTERS, rates={})

    text = engine_card(engine)["spec_decode"]["text"]

    assert text.startswith("acceptance unknown (no draft in the last interval)")
    assert "4 speculative tokens" in text


def test_the_engine_chart_draws_acceptance_only_for_a_speculative_engine(admin_client, node):
    engine = _engine(node, SPECULATIVE, snapshot=COUNTERS, rates={})
    now = timezone.now()
    EngineReading.objects.bulk_create(engine_readings([
        (engine, Sample(metric, now - timedelta(seconds=5 * i), value))
        for i in range(6)
        for metric, value in ((EngineMetric.SPEC_ACCEPTANCE, 0.743),
                              (EngineMetric.SPEC_TOKENS_PER_STEP, 3.97))
    ]))

    data = admin_client.get("/api/nodes/spark-a/engines/gemma/series.json?range=1h").json()
    engine.config = parse_command_line("vllm serve org/m").as_dict()
    engine.metrics = {"snapshot": {}}
    engine.save()
    plain = admin_client.get("/api/nodes/spark-a/engines/gemma/series.json?range=1h").json()

    series = {s["key"]: s for s in data["series"]}
    assert data["speculative"] is True
    assert series["spec_acceptance"]["y"] == [0.743] * 6
    assert series["spec_tokens_per_step"]["y"] == [3.97] * 6
    assert plain["speculative"] is False
    assert not {"spec_acceptance", "spec_tokens_per_step"} & {s["key"] for s in plain["series"]}
