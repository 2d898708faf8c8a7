"""Pages and JSON endpoints, through Django's test client."""

from datetime import timedelta

import pytest
from django.utils import timezone

from collectors.models import Collection, HostReading, Metric, Node
from collectors.readings import HOST, Sample

GIB = 1024**3


def _collect(node, at, available, free=None, ok=True, error=""):
    Collection.objects.create(node=node, at=at, window_started_at=at - timedelta(seconds=4.75),
                              ok=ok, error=error)
    if not ok:
        return
    HOST.reading(node, at, [
        Sample(Metric.MEM_AVAILABLE, at, available),
        Sample(Metric.MEM_AVAILABLE_MIN, at - timedelta(seconds=2), available - GIB),
        Sample(Metric.MEM_FREE, at, free,
               note="" if free is not None else "unreadable value 'n/a'"),
    ]).save()


@pytest.mark.parametrize("path", [
    "/", "/nodes/spark-a/", "/api/nodes/spark-a/headroom.json", "/api/nodes/spark-a/timeline.json",
])
def test_anonymous_users_are_sent_to_login(client, node, path):
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


def test_login_page_renders_and_logs_in(client, django_user_model, settings):
    settings.SPARKOPS_NODE_NAME = "spark-a"
    django_user_model.objects.create_superuser("admin", "", "a-long-test-password")

    assert client.get("/login/").status_code == 200
    response = client.post("/login/", {"username": "admin", "password": "a-long-test-password"})
    assert response.status_code == 302
    assert client.get("/", follow=True).redirect_chain[-1][0] == "/nodes/spark-a/"


def test_overview_shows_the_three_free_numbers_labelled_and_unknown_not_zero(admin_client, node):
    _collect(node, timezone.now(), available=30 * GIB, free=None)

    page = admin_client.get("/nodes/spark-a/").content.decode()

    assert "MemAvailable" in page
    assert "MemFree (≈ CUDA free on GB10)" in page
    assert "Reclaimable page cache" in page
    assert "30.00 GiB" in page
    assert "unknown" in page and "unreadable value &#x27;n/a&#x27;" in page
    assert "121.69 GiB (MemTotal)" in page
    assert "vendor/plotly.min.js" in page  # served by us, not a CDN
    assert "cdn" not in page.lower()


def test_headroom_json_reports_values_unknowns_and_staleness(admin_client, node):
    _collect(node, timezone.now() - timedelta(seconds=2), available=30 * GIB, free=None)

    data = admin_client.get("/api/nodes/spark-a/headroom.json").json()

    figures = {f["key"]: f for f in data["figures"]}
    assert figures["mem_available"]["value"] == 30.0
    assert figures["mem_available"]["display"] == "30.00 GiB"
    assert figures["mem_available_min"]["value"] == 29.0
    assert figures["mem_free"]["value"] is None
    assert figures["mem_free"]["unknown_reason"] == "unreadable value 'n/a'"
    assert data["stale"] is False and data["last_ok"] is True


def test_failed_collection_is_explained_on_the_page_and_in_json(admin_client, node):
    now = timezone.now()
    _collect(node, now - timedelta(seconds=10), available=30 * GIB, free=20 * GIB)
    _collect(node, now - timedelta(seconds=5), 0, ok=False,
             error="/proc/meminfo is not readable (permission denied)")

    data = admin_client.get("/api/nodes/spark-a/headroom.json").json()
    page = admin_client.get("/nodes/spark-a/").content.decode()
    chart = admin_client.get("/api/nodes/spark-a/timeline.json?range=1h").json()

    assert data["last_ok"] is False
    assert all(f["value"] is None for f in data["figures"])
    assert "Last collection failed: /proc/meminfo is not readable" in page
    assert chart["failures"][0]["error"].startswith("/proc/meminfo is not readable")
    available = next(s for s in chart["series"] if s["key"] == "mem_available")
    assert available["y"] == [30.0, None]  # the failure is a gap, not a zero


def test_no_collection_yet_is_stale_and_unknown(admin_client, node):
    data = admin_client.get("/api/nodes/spark-a/headroom.json").json()

    assert data["stale"] is True and data["collected_at"] is None
    assert {f["unknown_reason"] for f in data["figures"]} == {"no collection yet"}


def test_timeline_json_downsamples_and_keeps_the_dip(admin_client, node, settings):
    settings.SPARKOPS_MAX_CHART_POINTS = 600
    now = timezone.now()
    rows = [
        HOST.reading(node, now - timedelta(seconds=5 * i), [
            Sample(Metric.MEM_AVAILABLE, now - timedelta(seconds=5 * i),
                   (3 if i == 321 else 40) * GIB)])
        for i in range(700)
    ]
    HostReading.objects.bulk_create(rows)

    data = admin_client.get("/api/nodes/spark-a/timeline.json?range=1h").json()

    available = next(s for s in data["series"] if s["key"] == "mem_available")
    assert len(available["x"]) <= 600
    assert min(v for v in available["y"] if v is not None) == 3.0
    assert data["source"] == "raw"


def test_timeline_json_uses_rollups_for_long_ranges(admin_client, node):
    from collectors.models import Rollup

    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(days=20)
    Rollup.objects.create(node=node, metric=Metric.MEM_AVAILABLE, resolution=3600, start=hour,
                          min=2 * GIB, max=9 * GIB, mean=5 * GIB, count=720)
    node.rolled_up_until = hour + timedelta(hours=1)
    node.save()

    data = admin_client.get("/api/nodes/spark-a/timeline.json?range=30d").json()

    available = next(s for s in data["series"] if s["key"] == "mem_available")
    assert data["source"] == "1 h"
    assert available["y"] == [2.0, 9.0]


@pytest.mark.parametrize("query", ["range=2h", "range=1h&max_points=lots"])
def test_bad_chart_parameters_get_a_clear_error(admin_client, node, query):
    response = admin_client.get(f"/api/nodes/spark-a/timeline.json?{query}")

    assert response.status_code == 400
    assert response.json()["error"]


def test_unknown_node_is_404(admin_client, node):
    assert admin_client.get("/nodes/nope/").status_code == 404
    assert admin_client.get("/api/nodes/nope/headroom.json").status_code == 404


def test_node_picker_lists_every_node(admin_client, node):
    Node.objects.create(name="spark-b")

    page = admin_client.get("/nodes/spark-a/").content.decode()

    assert "/nodes/spark-b/" in page
