"""The ledger bar in a real browser: prefill-need labels of engines whose needs lie close
together never print over each other, at desktop and phone widths."""

from __future__ import annotations

import pytest
from django.utils import timezone

from collectors.models import Engine, Node
from sparkops.units import GIB
from tests.test_browser_pages import PASSWORD, _login

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _share(engine: Engine, need_gib: float) -> dict:
    return {"engine_id": engine.pk, "name": engine.name, "weights": 15 * GIB, "kv_pool": 6 * GIB,
            "cuda_graphs": GIB // 2, "actual": None, "prefill_estimate": int(need_gib * GIB),
            "prefill_observed": None, "prefill_need": int(need_gib * GIB),
            "prefill_need_source": "estimate", "reserved": None, "non_kv": None}


def _node_with_close_needs() -> Node:
    node = Node.objects.create(name="spark-a", mem_total_bytes=128 * GIB)
    names_and_needs = [("gemma-4-26b-a4b", 14.0), ("nemotron-3-super-120b", 14.3),
                       ("qwen3-coder-30b", 14.6), ("gpt-oss-120b", 40.0)]
    shares = [_share(Engine.objects.create(node=node, container_id=f"{i:064x}", name=name),
                     need) for i, (name, need) in enumerate(names_and_needs)]
    node.ledger = {"at": timezone.now().isoformat(), "mem_total": 128 * GIB,
                   "mem_available": 60 * GIB, "mem_available_min": 58 * GIB,
                   "page_cache_reclaimable": 4 * GIB, "swap_used": None, "engines": shares,
                   "processes": [], "others_total": 2 * GIB, "headroom": 58 * GIB}
    node.save()
    return node


def _label_boxes(page) -> list[dict]:
    return page.evaluate("""() => Array.from(document.querySelectorAll('.need-mark span'))
        .map(s => { const r = s.getBoundingClientRect();
                    return {name: s.textContent, left: r.left, right: r.right,
                            top: r.top, bottom: r.bottom}; })""")


def _overlapping(boxes: list[dict]) -> list[tuple[str, str]]:
    return [(a["name"], b["name"]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a["left"] < b["right"] and b["left"] < a["right"]
            and a["top"] < b["bottom"] and b["top"] < a["bottom"]]


@pytest.mark.parametrize("width", [1280, 390])
def test_close_prefill_needs_get_labels_that_do_not_overlap(live_server, page, settings,
                                                            django_user_model, width):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    _node_with_close_needs()
    django_user_model.objects.create_superuser("admin", "", PASSWORD)
    page.set_viewport_size({"width": width, "height": 900})
    _login(page, live_server.url)
    page.goto(f"{live_server.url}/nodes/spark-a/")
    page.wait_for_selector(".ledger-bar[data-label-lines]")

    boxes = _label_boxes(page)
    assert sorted(b["name"] for b in boxes) == ["gemma-4-26b-a4b", "gpt-oss-120b",
                                                 "nemotron-3-super-120b", "qwen3-coder-30b"]
    assert _overlapping(boxes) == []
    # The three close needs cannot share one line; the labels stay inside the page.
    assert int(page.get_attribute(".ledger-bar", "data-label-lines")) >= 2
    assert all(b["left"] >= 0 and b["right"] <= width for b in boxes)
    # Labels below the bar do not run into what follows it.
    legend_top = page.evaluate(
        "document.querySelector('.ledger-legend').getBoundingClientRect().top")
    assert max(b["bottom"] for b in boxes) <= legend_top
