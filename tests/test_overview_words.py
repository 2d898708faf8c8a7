"""The overview says what it knows: no swap and a prefill need never observed are words, not 0;
an unreachable container engine says what to set; firing alerts lead the page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from collectors import docker_api
from collectors.ledger import build_ledger, record_changes
from collectors.models import Collection, Engine, Metric
from collectors.readings import HOST, Sample
from dashboard.alerting.models import Alert, AlertState
from dashboard.ledger import ledger_bar

GIB = 1024**3


def _collect(node, swap_total: int, swap_free: int) -> None:
    at = timezone.now()
    Collection.objects.create(node=node, at=at, window_started_at=at - timedelta(seconds=4.75),
                              ok=True)
    HOST.reading(node, at, [
        Sample(Metric.MEM_AVAILABLE, at, 30 * GIB),
        Sample(Metric.SWAP_TOTAL, at, swap_total),
        Sample(Metric.SWAP_FREE, at, swap_free),
        Sample(Metric.SWAP_USED, at, swap_total - swap_free),
    ]).save()


def test_swap_in_use_without_swap_says_no_swap_in_the_page_and_its_json(admin_client, node):
    _collect(node, swap_total=0, swap_free=0)

    data = admin_client.get("/api/nodes/spark-a/headroom.json").json()
    page = admin_client.get("/nodes/spark-a/").content.decode()

    swap = next(f for f in data["figures"] if f["key"] == "swap_used")
    assert swap["value"] is None and swap["display"] == "no swap"
    assert "SwapTotal is 0" in swap["unknown_reason"]
    figure = page[page.index('data-key="swap_used"'):]
    figure = figure[:figure.index("</div>\n    </div>")]
    assert "no swap" in figure and "0.00 GiB" not in figure


def test_swap_in_use_with_swap_stays_a_number(admin_client, node):
    _collect(node, swap_total=8 * GIB, swap_free=8 * GIB)

    data = admin_client.get("/api/nodes/spark-a/headroom.json").json()

    swap = next(f for f in data["figures"] if f["key"] == "swap_used")
    assert swap["value"] == 0.0 and swap["display"] == "0.00 GiB"


def _ledger_with(node, observed: int | None) -> None:
    engine = Engine.objects.create(node=node, name="gemma", container_id="gemma-id",
                                   container_state="running", phase="ready",
                                   startup={"weights_gib": 10, "kv_cache_gib": 20},
                                   prefill_bytes_per_token=256 * 1024,
                                   prefill_observed_bytes=observed)
    figures = {"mem_total": 120 * GIB, "mem_available": 60 * GIB,
               "mem_available_min": 59 * GIB, "page_cache_reclaimable": 4 * GIB}
    record_changes(node, build_ledger(node, timezone.now(), figures, [engine], []),
                   timezone.now())


def test_a_prefill_need_never_observed_says_so_in_the_page_and_the_api(admin_client, node):
    _ledger_with(node, observed=None)

    page = admin_client.get("/nodes/spark-a/").content.decode()
    node.refresh_from_db()

    assert "(estimate 512 MiB, not observed yet)" in page  # 2048 tokens × 256 KiB
    assert "observed 0.00 GiB" not in page
    row = ledger_bar(node)["engines"][0]
    assert row["observed_gib"] is None and row["observed_bytes"] is None
    assert node.ledger["engines"][0]["prefill_observed"] is None


def test_a_small_observed_prefill_need_is_not_written_as_zero(admin_client, node):
    _ledger_with(node, observed=4 * 1024**2)

    page = admin_client.get("/nodes/spark-a/").content.decode()

    assert "observed 4 MiB" in page and "0.00 GiB" not in page


def test_an_unreachable_container_engine_says_what_to_set(monkeypatch):
    monkeypatch.setenv("SPARKOPS_DOCKER_HOST", "unix:///nonexistent/docker.sock")

    with pytest.raises(docker_api.ContainerEngineError) as raised:
        docker_api.client()

    words, _, detail = str(raised.value).partition(docker_api.DETAIL_SEPARATOR)
    assert words.startswith("Cannot reach the container engine at unix:///nonexistent/docker")
    assert "SPARKOPS_DOCKER_HOST" in words and "access" in words
    assert "there is no socket there" in words
    assert "Error while fetching" not in words and "FileNotFoundError" in detail


def test_the_overview_shows_the_engine_error_in_words_and_the_raw_reason_as_detail(
        admin_client, node):
    node.engine_discovery_error = (
        "Cannot reach the container engine at unix:///run/docker.sock: there is no socket "
        f"there. Set SPARKOPS_DOCKER_HOST.{docker_api.DETAIL_SEPARATOR}FileNotFoundError(2)")
    node.save()

    page = admin_client.get("/nodes/spark-a/").content.decode()

    assert "Engines cannot be listed: Cannot reach the container engine" in page
    assert "<summary>Detail</summary><pre>FileNotFoundError(2)</pre>" in page


def test_firing_alerts_come_before_the_figures(admin_client, node):
    Alert.objects.create(node=node, rule="headroom-floor", severity="critical",
                         started_at=timezone.now(), last_evaluated_at=timezone.now(),
                         state=AlertState.FIRING, fired_at=timezone.now(),
                         summary="headroom 1.2 GiB below the floor", value=1.2, threshold=2.0)

    page = admin_client.get("/nodes/spark-a/").content.decode()
    fragment = admin_client.get("/nodes/spark-a/engines/cards/").content.decode()

    assert page.count('id="firing-alerts"') == 1
    assert page.index('id="firing-alerts"') < page.index('id="figures"')
    assert "headroom 1.2 GiB below the floor" in page
    assert 'id="firing-alerts"' in fragment  # the live refresh brings its own copy


def test_an_ollama_prefill_need_is_in_its_models_size_not_a_label_to_set(admin_client, node):
    """Ollama sizes each loaded model with its compute buffer: the page does not ask for a
    prefill label there, and says where the need is counted."""
    chat = Engine.objects.create(node=node, name="chat", kind="ollama", container_id="chat-id",
                                 container_state="running", phase="ready",
                                 metrics={"details": {"size_bytes": 19 * GIB,
                                                      "models": [{"name": "qwen3:30b"}]}})
    figures = {"mem_total": 120 * GIB, "mem_available": 60 * GIB,
               "mem_available_min": 59 * GIB, "page_cache_reclaimable": 4 * GIB}
    record_changes(node, build_ledger(node, timezone.now(), figures, [chat], []), timezone.now())

    page = admin_client.get("/nodes/spark-a/").content.decode()

    assert "in its loaded models&#x27; size" in page or "in its loaded models' size" in page
    assert "set sparkops.prefill-bytes-per-token" not in page
