"""Every time on the pages in the viewer's zone, labelled, in one format: a browser in Asia/Seoul
reads the alerts list, an alert, a restart, the overview's banner and its chart, against instants
seeded in UTC (Seoul is UTC+9 all year, labelled KST)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from collectors.models import Node
from dashboard.alerting.models import Alert
from dashboard.restarts.models import Restart
from dashboard.restarts.planning import plan_restart
from tests.browser import _compile_predicates_as_functions
from tests.restarts.plan_factories import make_window
from tests.test_browser_pages import (
    GIB,
    PASSWORD,
    STEP,
    WIDE,
    _login,
    _wait_for_timeline,
    seed_world,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def seoul(moment: datetime) -> str:
    return (moment + timedelta(hours=9)).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S") + " KST"


@pytest.fixture
def seoul_page(browser):
    context = browser.new_context(timezone_id="Asia/Seoul", viewport=WIDE)
    page = context.new_page()
    _compile_predicates_as_functions(page)
    yield page
    page.goto("about:blank")
    page.wait_for_timeout(500)
    context.close()


def test_a_browser_in_seoul_reads_every_time_in_kst(live_server, seoul_page, django_user_model,
                                                    settings):
    page = seoul_page
    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.SPARKOPS_COLLECT_INTERVAL = float(STEP)
    assert settings.TIME_ZONE == "UTC"  # the server's default zone is not the viewer's
    node = Node.objects.create(name="spark-a", mem_total_bytes=int(121.69 * GIB))
    now = timezone.now().replace(microsecond=0)
    seed_world(node, now, squeeze_alert=True)
    django_user_model.objects.create_superuser("admin", "", PASSWORD)
    backlog = Alert.objects.get(rule="queue-backlog")
    squeeze = Alert.objects.get(rule="prefill-squeeze")
    restart = Restart.objects.get(kind="planned")

    # The first page a new browser sees sets the zone cookie and is shown in that zone.
    _login(page, live_server.url)
    assert {c["name"]: c["value"] for c in page.context.cookies()}["sparkops_tz"] == "Asia/Seoul"

    page.goto(f"{live_server.url}/alerts/")
    listed = page.locator("body").inner_text()
    assert seoul(backlog.started_at) in listed and seoul(backlog.resolved_at) in listed
    assert seoul(squeeze.fired_at) in listed
    first = page.locator("table time").first
    assert first.get_attribute("title") == "Asia/Seoul"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first.get_attribute("datetime"))

    page.goto(f"{live_server.url}/alerts/{backlog.pk}/")
    detail = page.locator("main").inner_text()
    for moment in [backlog.started_at, backlog.fired_at, backlog.resolved_at]:
        assert seoul(moment) in detail

    page.goto(f"{live_server.url}/restarts/{restart.pk}/")
    shown = page.locator("main").inner_text()
    for moment in [restart.requested_at, restart.started_at, restart.finished_at]:
        assert seoul(moment) in shown
    page.goto(f"{live_server.url}/restarts/")
    assert seoul(restart.requested_at)[:16] in page.locator("main").inner_text()
    page.wait_for_function("document.getElementById('startup-chart')?._fullLayout")
    title = page.evaluate("document.getElementById('startup-chart')._fullLayout.xaxis.title.text")
    assert title == "time (KST)"

    # A Berlin window and a plan in it: the viewer's zone first, the window's own beside it.
    window = make_window(node, name="berlin night", zone="Europe/Berlin",
                         local_start=datetime(2036, 11, 2, 3, 0))
    type(restart.engine).objects.filter(pk=restart.engine_id).update(managed=True)
    restart.engine.refresh_from_db()
    planned = plan_restart(restart.engine, user=django_user_model.objects.get(), window=window,
                           now=timezone.now(), reason="zones")
    page.goto(f"{live_server.url}/restarts/windows/")
    row = page.locator("tr", has_text="berlin night").inner_text()
    assert "2036-11-02 11:00–13:00 KST" in row and "2036-11-02 03:00–05:00 CET" in row
    page.goto(f"{live_server.url}/restarts/{planned.pk}/")
    shown = page.locator("main").inner_text()
    assert seoul(planned.scheduled_for) in shown
    assert "(window's zone: 2036-11-02 03:00 CET, Europe/Berlin)" in shown
    assert "Sun 2036" not in shown

    # The overview: the firing banner's exact time (its tooltip), the last collection, the
    # timeline's axis title and a point drawn at Seoul's wall-clock time.
    page.goto(f"{live_server.url}/nodes/spark-a/")
    _wait_for_timeline(page)
    banner = page.locator("#firing-alerts time").first
    assert banner.get_attribute("title") == seoul(squeeze.fired_at)
    collected = page.locator("#collected-at time")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d KST", collected.get_attribute("title"))
    layout = page.evaluate("""() => { const l = document.getElementById('timeline')._fullLayout;
        const keys = Object.keys(l).filter(k => /^xaxis\\d*$/.test(k));
        return keys.map(k => l[k].title && l[k].title.text)
            .filter(t => t && t.startsWith('time')); }""")
    assert layout == ["time (KST)"]
    last_x = page.evaluate("""document.getElementById('timeline').data
        .find(t => t.meta === 'mem_available').x.slice(-1)[0]""")
    drawn = datetime.fromisoformat(last_x)  # wall-clock, no zone: Plotly draws it as written
    assert abs(drawn - (now + timedelta(hours=9)).replace(tzinfo=None)) < timedelta(minutes=2)
