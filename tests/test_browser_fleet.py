"""The fleet page in a real browser: three GB10 nodes, two of them apart by a kernel and an engine
release, the third gone silent. The differing rows are highlighted as drawn (their background
and the word "differs"), the silent node is greyed with its last known state, and an engine
spanning two nodes with different drivers is named. The screenshot goes to the test's temporary
directory, or to ``docs/fleet.png`` with ``SPARKOPS_UPDATE_SCREENSHOTS=1``.
"""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from tests.test_browser_pages import PASSWORD, WIDE, _login, screenshot  # noqa: F401
from tests.test_fleet_view import EngineSpec, facts, firing, fleet_node

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

GEMMA = "gemma-4-26b"
NEMOTRON = "nemotron-120b"


def _seed_fleet() -> None:
    now = timezone.now()
    tp2 = "vllm-mp:nemotron-tp2"
    fleet_node("spark-01", now, skew=0.3, available_gib=30, engines=(
        EngineSpec(GEMMA),
        EngineSpec(NEMOTRON, decode=23.4, prefill=1884.0, span_key=tp2,
                   env={"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "NCCL_IB_HCA": "rocep1s0f0"})),
        node_facts=facts(hostname="spark-01"))
    fleet_node("spark-02", now, skew=7.2, available_gib=14, engines=(
        EngineSpec(GEMMA, version="0.32.1", image="vllm/vllm-openai:v0.32.1", decode=38.9,
                   prefill=1130.0),
        EngineSpec(NEMOTRON, decode=23.1, prefill=1870.0, span_key=tp2,
                   env={"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "NCCL_IB_HCA": "rocep1s0f0"})),
        node_facts=facts(hostname="spark-02", kernel="6.11.0-1014-nvidia",
                         driver="580.82.07"))
    silent = fleet_node("spark-03", now, beat_age=200, available_gib=41,
                        engines=(EngineSpec("qwen3-32b", decode=17.0, prefill=950.0),),
                        node_facts=facts(hostname="spark-03", driver=None))
    firing(silent, "node-unreachable", "critical",
           "spark-03 is unreachable: last contact 3 min 20 s ago (the bound is 30 s)", 170, now)


def test_the_fleet_page_highlights_drift_and_greys_a_silent_node(
        live_server, page, django_user_model, settings, screenshot):  # noqa: F811
    settings.SPARKOPS_NODE_NAME = "spark-01"
    settings.SPARKOPS_HEARTBEAT_SECONDS = 10.0
    settings.SPARKOPS_UNREACHABLE_AFTER_BEATS = 3.0
    _seed_fleet()
    django_user_model.objects.create_superuser("admin", "", PASSWORD)
    page.set_viewport_size(WIDE)

    _login(page, live_server.url)  # more than one node: the home page is the fleet
    page.wait_for_selector("#fleet")
    assert page.locator("#fleet-link").inner_text() == "Fleet"

    kernel = page.locator("tr[data-row='fact:kernel']")
    version = page.locator(f"tr[data-row='engine:{GEMMA}:version']")
    same = page.locator("tr[data-row='fact:os']")
    for row in (kernel, version):
        assert "differs" in (row.get_attribute("class") or "").split()
        assert row.locator(".drift-verdict").inner_text() == "differs"
    assert same.locator(".drift-verdict").inner_text() == "same"
    marked = kernel.locator("td").first.evaluate("e => getComputedStyle(e).backgroundColor")
    plain = same.locator("td").first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert marked != plain and marked not in ("rgba(0, 0, 0, 0)", "transparent")
    assert kernel.locator("td").all_inner_texts() == ["6.11.0-1016-nvidia", "6.11.0-1014-nvidia",
                                                      "6.11.0-1016-nvidia"]
    # An unknown driver on the silent node is shown with its reason and is no difference of
    # its own; the two known drivers differ.
    driver = page.locator("tr[data-row='fact:driver']")
    assert driver.locator("td").nth(2).inner_text() == "unknown — driver could not be read"
    assert page.locator("#drift-findings li").all_inner_texts() == [
        f"{NEMOTRON} spans spark-01 and spark-02, whose kernels differ: 6.11.0-1016-nvidia vs "
        "6.11.0-1014-nvidia",
        f"{NEMOTRON} spans spark-01 and spark-02, whose drivers differ: 580.95.05 vs 580.82.07",
    ]

    silent = page.locator("article[data-node='spark-03']")
    assert silent.locator(".contact-badge").inner_text().lower() == "unreachable"
    assert re.search(r"last contact 3 min \d+ s ago", silent.inner_text())
    style = silent.evaluate("e => [getComputedStyle(e).opacity, getComputedStyle(e).filter]")
    assert float(style[0]) < 1 and "grayscale" in style[1]
    assert "17.0 tok/s" in silent.inner_text()  # its last known state is still there
    reachable = page.locator("article[data-node='spark-01']")
    assert reachable.evaluate("e => getComputedStyle(e).opacity") == "1"
    assert "node clock 7.2 s ahead of the centre" in \
        page.locator("article[data-node='spark-02']").inner_text()

    screenshot(page, "fleet.png")

    # Each node's name leads to its overview, which says the same about a silent node.
    silent.locator("header a").click()
    page.wait_for_url("**/nodes/spark-03/")
    assert "its last known state, not the present" in page.inner_text("#node-contact")
