"""The overview in a real browser: login, live figures, the chart, range switching."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from collectors.models import Collection, Metric, Node
from collectors.readings import HOST, Sample
from dashboard.alerting.models import Alert, AlertState

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
GIB = 1024**3


def _seed(node: Node) -> None:
    now = timezone.now()
    for i in range(60):
        at = now - timedelta(seconds=5 * (59 - i))
        Collection.objects.create(node=node, at=at, window_started_at=at - timedelta(seconds=4.75),
                                  ok=True)
        HOST.reading(node, at, [
            Sample(Metric.MEM_AVAILABLE, at, (40 + i % 3) * GIB),
            Sample(Metric.MEM_AVAILABLE_MIN, at, (12 if i == 30 else 39) * GIB),
            Sample(Metric.MEM_FREE, at, None, note="missing from /proc/meminfo"),
        ]).save()


def test_overview_logs_in_shows_figures_and_draws_the_chart(live_server, page, django_user_model,
                                                              settings):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    node = Node.objects.create(name="spark-a", mem_total_bytes=int(121.69 * GIB))
    _seed(node)
    django_user_model.objects.create_superuser("admin", "", "a-long-test-password")

    page.goto(f"{live_server.url}/")
    assert "/login/" in page.url
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "a-long-test-password")
    page.click("button[type=submit]")
    page.wait_for_url("**/nodes/spark-a/")

    available = page.locator('.figure[data-key="mem_available"] .value')
    assert available.inner_text().endswith("GiB")
    assert page.locator('.figure[data-key="mem_free"] .value').inner_text() == "unknown"
    # The host-memory chart is now the timeline's headroom panel (one figure, one time axis).
    page.wait_for_function("document.getElementById('timeline')?.data?.length >= 6")
    lowest = page.evaluate(
        "Math.min(...document.getElementById('timeline').data"
        ".find(t => t.meta === 'mem_available_min').y.filter(v => v !== null))"
    )
    assert lowest == 12.0  # the dip drawn, not averaged away

    with page.expect_response(lambda r: "range=6h" in r.url):
        page.click('.ranges button[data-range="6h"]')
    assert page.url.endswith("?range=6h")
    assert "active" in page.locator('.ranges button[data-range="6h"]').get_attribute("class")


def test_overview_refreshes_itself_while_open(live_server, page, django_user_model,
                                              settings):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.SPARKOPS_COLLECT_INTERVAL = 1.0
    node = Node.objects.create(name="spark-a", mem_total_bytes=int(121.69 * GIB))
    user = django_user_model.objects.create_superuser("admin", "", "a-long-test-password")
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", "a-long-test-password")
    page.click("button[type=submit]")
    page.wait_for_url("**/nodes/spark-a/")
    assert page.locator('.figure[data-key="mem_available"] .value').inner_text() == "unknown"
    # No engines yet: the page says how SparkOps finds them.
    empty = page.locator(".empty-state").inner_text()
    assert "SPARKOPS_DOCKER_HOST" in empty and "sparkops.engine=vllm" in empty

    at = timezone.now()
    Collection.objects.create(node=node, at=at, window_started_at=at - timedelta(seconds=1),
                              ok=True)
    HOST.reading(node, at, [Sample(Metric.MEM_AVAILABLE, at, 33 * GIB)]).save()

    page.wait_for_function(
        "document.querySelector('.figure[data-key=\"mem_available\"] .value')"
        ".textContent === '33.00 GiB'", timeout=10_000,
    )

    # An alert that fires while the page is open appears above the figures, also on a phone.
    page.set_viewport_size({"width": 390, "height": 844})
    Alert.objects.create(node=node, rule="headroom-floor", severity="critical",
                         state=AlertState.FIRING, fired_at=at, started_at=at,
                         last_evaluated_at=at, value=1.2, threshold=2.0,
                         summary="headroom 1.2 GiB below the floor")
    page.wait_for_function(
        "document.getElementById('firing-alerts').textContent.includes('below the floor')",
        timeout=10_000,
    )
    assert page.locator("#firing-alerts").count() == 1
    strip, figures = page.locator("#firing-alerts").bounding_box(), \
        page.locator("#figures").bounding_box()
    assert strip["y"] + strip["height"] <= figures["y"]


def test_polling_backs_off_while_the_tab_is_hidden(live_server, page, django_user_model,
                                                  settings):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.SPARKOPS_COLLECT_INTERVAL = 1.0  # the page polls every 2 s at the fastest
    Node.objects.create(name="spark-a", mem_total_bytes=int(121.69 * GIB))
    django_user_model.objects.create_superuser("admin", "", "a-long-test-password")
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "a-long-test-password")
    page.click("button[type=submit]")
    page.wait_for_url("**/nodes/spark-a/")
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if "headroom.json" in r.url else None)

    page.wait_for_timeout(6_000)
    visible = len(polls)
    page.evaluate("""() => {
        Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    page.wait_for_timeout(2_500)  # let the poll already scheduled go out
    polls.clear()
    page.wait_for_timeout(7_000)
    hidden = len(polls)
    page.evaluate("""() => {
        Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    page.wait_for_timeout(500)

    assert visible >= 2
    assert hidden <= 1
    assert len(polls) > hidden  # shown again: refreshed at once
