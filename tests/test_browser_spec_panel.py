"""The engine page's chart in a real browser: a speculative engine gets a panel of its draft
acceptance (%) and tokens per step; an engine without speculative decoding gets none (nothing is
drawn as 0 %)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from collectors.models import Engine, EngineMetric, EngineReading, Node
from collectors.readings import ENGINE, Sample
from collectors.vllm.flags import parse_command_line
from tests.test_browser_pages import PASSWORD, _login

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SPECULATIVE = ["vllm", "serve", "org/m", "--speculative-config",
               '{"method": "eagle", "num_speculative_tokens": 4}']


def _engine(node: Node, name: str, command: list[str]) -> Engine:
    engine = Engine.objects.create(
        node=node, name=name, container_id=name * 8, container_state="running", phase="ready",
        config=parse_command_line(command).as_dict(), metrics={"snapshot": {"model_name": name}})
    now = timezone.now()
    EngineReading.objects.bulk_create([
        ENGINE.reading(engine, now - timedelta(seconds=5 * i), [
            Sample(metric, now - timedelta(seconds=5 * i), value)
            for metric, value in ((EngineMetric.DECODE_TPS, 40.0),
                                  (EngineMetric.SPEC_ACCEPTANCE, 0.743),
                                  (EngineMetric.SPEC_TOKENS_PER_STEP, 3.97))])
        for i in range(12)
    ])
    return engine


def _traces(page) -> dict[str, dict]:
    page.wait_for_function("document.getElementById('engine-charts').data !== undefined")
    return {trace["meta"]: trace for trace in page.evaluate(
        "() => document.getElementById('engine-charts').data.map("
        "t => ({meta: t.meta, yaxis: t.yaxis, y: t.y}))")}


def test_a_speculative_engine_s_chart_draws_acceptance_and_tokens_per_step(live_server, page,
                                                                           django_user_model):
    node = Node.objects.create(name="spark-a", mem_total_bytes=128 * 1024**3)
    _engine(node, "drafting", SPECULATIVE)
    _engine(node, "plain", ["vllm", "serve", "org/m"])
    django_user_model.objects.create_superuser("admin", "", PASSWORD)
    _login(page, live_server.url)

    page.goto(f"{live_server.url}/nodes/spark-a/engines/drafting/")
    speculative = _traces(page)
    titles = page.evaluate("() => Array.from(document.querySelectorAll('#engine-charts "
                           ".annotation-text')).map(a => a.textContent)")
    page.goto(f"{live_server.url}/nodes/spark-a/engines/plain/")
    plain = _traces(page)

    assert speculative["spec_acceptance"]["yaxis"] == "y6"
    assert speculative["spec_acceptance"]["y"] == pytest.approx([74.3] * 12)
    assert speculative["spec_tokens_per_step"]["yaxis"] == "y7"
    assert speculative["spec_tokens_per_step"]["y"] == pytest.approx([3.97] * 12)
    assert "Speculative decoding: draft acceptance and tokens per step" in titles
    assert "decode_tps" in plain
    assert not {"spec_acceptance", "spec_tokens_per_step"} & set(plain)
