"""The fit planner page in a real browser, on the seed's node (Gemma-4 next to Nemotron).

The page is reached from the overview's link, plans Nemotron's KV pool 8 → 24 GiB with the
flags edited in its form, and answers: the headroom 30 → 14 GiB, Gemma's prefill squeezed,
and the largest pool Nemotron can take while Gemma's prefill still fits. Bad input is one
clear line and no figures. The screenshot goes to the test's temporary directory, or to
``docs/planner.png`` with ``SPARKOPS_UPDATE_SCREENSHOTS=1``.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import PROJECT
from tests.test_planner import NEMOTRON_COMMAND, seed_node

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "a-long-test-password"
UPDATE_SCREENSHOTS = "SPARKOPS_UPDATE_SCREENSHOTS"


def _login(page, base: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/nodes/.*|.*/$"))


def test_the_planner_answers_for_the_seeds_node(live_server, page, django_user_model, settings,
                                                tmp_path):
    settings.SPARKOPS_NODE_NAME = "spark-01"
    seed_node("spark-01")
    django_user_model.objects.create_superuser("admin", "", PASSWORD)
    page.goto(f"{live_server.url}/nodes/spark-01/planner/")
    assert "/login/?next=" in page.url  # login required

    page.set_viewport_size({"width": 1400, "height": 900})
    _login(page, live_server.url)
    page.goto(f"{live_server.url}/nodes/spark-01/")
    page.click("#planner-link")
    page.wait_for_selector("#planner-form")
    page.select_option("#planner-engine", "nemotron-120b")
    page.fill("#planner-command", NEMOTRON_COMMAND.format(kv="24G", util="0.8"))
    page.click("#planner-form button[type=submit]")
    page.wait_for_selector("#planner-result")

    assert page.locator("#planner-result").get_attribute("data-verdict") == "squeezes"
    assert "squeezes gemma-4-26b's prefill" in page.inner_text("#planner-verdict")
    assert page.inner_text("[data-field=headroom]").startswith("30.00 GiB → 14.00 GiB")
    gemma = page.locator("tr[data-engine='gemma-4-26b']")
    assert gemma.get_attribute("data-verdict") == "squeezed"
    assert gemma.locator("[data-field=fits]").inner_text() == "yes → no"
    nemotron = page.locator("tr[data-engine='nemotron-120b']")
    # Unknown is a word, never a number, and its reason is given once, under the table.
    assert nemotron.locator("[data-field=kv-tokens]").inner_text() == "1,048,576 → unknown*"
    assert "Mamba" in page.inner_text("#planner-unknown")
    assert page.inner_text("#planner-result").count("the architecture is not known") == 1
    largest = page.locator("#planner-largest")
    assert int(largest.get_attribute("data-bytes")) == int(23.5 * 1024**3)
    assert "nemotron-120b can take a KV pool of up to 23.50 GiB" in largest.inner_text()
    assert "margin 2.00 GiB" in largest.inner_text()

    folder = PROJECT / "docs" if os.environ.get(UPDATE_SCREENSHOTS) == "1" else tmp_path
    page.screenshot(path=str(folder / "planner.png"), full_page=True)
    assert (folder / "planner.png").stat().st_size > 0

    # An engine page links to the planner with the engine chosen and its flags prefilled.
    page.goto(f"{live_server.url}/nodes/spark-01/engines/gemma-4-26b/")
    page.click("#planner-link")
    page.wait_for_selector("#planner-result")
    assert "--kv-cache-memory-bytes 20G" in page.input_value("#planner-command")
    assert page.locator("#planner-result").get_attribute("data-verdict") == "fits"

    # Bad input: one clear line, no figures.
    page.fill("#planner-command", "vllm serve someone/unheard-of-7b --kv-cache-memory-bytes 8G")
    page.select_option("#planner-engine", "__new__")
    page.fill("#planner-version", "0.33.0")
    page.click("#planner-form button[type=submit]")
    page.wait_for_selector("#planner-error")
    assert "unknown model someone/unheard-of-7b" in page.inner_text("#planner-error")
    assert page.locator("#planner-result").count() == 0
