"""The fleet page: every node at a glance (headroom against each engine's prefill need, firing
alerts, engines, last contact and clock skew), an unreachable node greyed with its last known
state, the home page and the navigation once there is a second node, and a constant number of
queries however many nodes there are."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from collectors.ledger import build_ledger
from collectors.models import Engine, Node
from dashboard.alerting.models import Alert, AlertState
from dashboard.fleet import clock_skew_text, fleet_overview, node_contact
from sparkops.units import GIB

pytestmark = pytest.mark.django_db

TOTAL = int(121.69 * GIB)
PER_TOKEN_12_5_GIB = int(12.5 * GIB) // 8192  # 8,192 batched tokens: a 12.5 GiB prefill
INTERVAL = 5.0
FACT_DEFAULTS = {
    "kernel": "6.11.0-1016-nvidia", "os": "Ubuntu 24.04.3 LTS", "dgx_os": "7.2.3",
    "driver": "580.95.05", "cuda": "13.0", "firmware": "5.2.0", "swappiness": "60",
    "min_free_kbytes": "1048576", "overcommit_memory": "0", "watermark_scale_factor": "10",
    "transparent_hugepage": "madvise", "sparkops_version": "1.4.0",
}
PORT = {"name": "enp1s0f0np0", "kind": "net", "driver": "mlx5_core", "state": "up",
        "rate_gbps": 200.0, "rate_text": "200000 Mb/s", "mtu": 9000, "link_layer": "Ethernet",
        "unknown": ""}


@dataclass
class EngineSpec:
    name: str
    version: str | None = "0.33.0"
    need_per_token: int | None = PER_TOKEN_12_5_GIB
    decode: float | None = 41.1
    prefill: float | None = 2400.0
    phase: str = "ready"
    image: str = "vllm/vllm-openai:v0.33.0"
    env: dict[str, str] = field(default_factory=lambda: {"PATH": "/usr/bin",
                                                         "NCCL_SOCKET_IFNAME": "enp1s0f0np0"})
    span_key: str = ""


def facts(ports: list[dict] | None = None, **values: str | None) -> dict:
    """``Node.facts`` as a registering worker writes it; a value of None is unknown."""
    items = {}
    for key, value in {"hostname": None, **FACT_DEFAULTS, **values}.items():
        items[key] = ({"value": value, "source": f"test {key}"} if value is not None
                      else {"value": None, "source": f"test {key}",
                            "unknown": f"{key} could not be read"})
    return {"read_at": "2026-03-02T09:00:00+00:00", "items": items,
            "interconnect": [dict(PORT)] if ports is None else ports}


def fleet_node(name: str, now: datetime, *, beat_age: float | None = 2.0, skew: float = 0.0,
               available_gib: float = 30.0, engines: tuple[EngineSpec, ...] | None = None,
               node_facts: dict | None = None) -> Node:
    """A node as its worker leaves it: facts, a heartbeat ``beat_age`` seconds before ``now``
    (None: never beat), and a second before it its last collection, with a ledger of
    ``available_gib`` headroom over its engines."""
    collected = now - timedelta(seconds=(2.0 if beat_age is None else beat_age) + 1)
    node = Node.objects.create(
        name=name, hostname=name, mem_total_bytes=TOTAL,
        facts=node_facts if node_facts is not None else facts(hostname=name),
        heartbeat_at=None if beat_age is None else now - timedelta(seconds=beat_age),
        agent_started_at=None if beat_age is None else now - timedelta(hours=1),
        clock_skew_seconds=None if beat_age is None else skew,
        last_collection_at=collected)
    rows = [_engine(node, spec) for spec in (engines if engines is not None
                                             else (EngineSpec("gemma"),))]
    figures = {"mem_total": TOTAL, "mem_available": int(available_gib * GIB),
               "mem_available_min": int(available_gib * GIB),
               "page_cache_reclaimable": 2 * GIB, "swap_used": 0}
    node.ledger = build_ledger(node, collected, figures, rows, []).as_dict()
    node.save()
    return node


def _engine(node: Node, spec: EngineSpec) -> Engine:
    startup = {"weights_gib": 15.0, "kv_cache_gib": 6.0, "cuda_graph_gib": 0.5,
               "phase": spec.phase}
    if spec.version:
        startup["version"] = spec.version
    return Engine.objects.create(
        node=node, name=spec.name, container_id=f"{node.name}-{spec.name}".ljust(64, "0"),
        container_state="running", phase=spec.phase, image=spec.image,
        config={"max_num_batched_tokens": 8192}, startup=startup,
        rates={"decode_tokens_per_s": spec.decode, "prefill_tokens_per_s": spec.prefill},
        prefill_bytes_per_token=spec.need_per_token, env=spec.env, span_key=spec.span_key)


def firing(node: Node, rule: str, severity: str, summary: str, fired_ago: float,
           now: datetime) -> Alert:
    at = now - timedelta(seconds=fired_ago)
    return Alert.objects.create(rule=rule, node=node, scope=f"{rule}:{node.pk}:-",
                                state=AlertState.FIRING, severity=severity, summary=summary,
                                threshold=0.0, started_at=at, fired_at=at, last_evaluated_at=at)


def card(html: str, node: str) -> str:
    """The fleet page's card of ``node``."""
    match = re.search(rf'<article [^>]*data-node="{node}"[^>]*>.*?</article>', html, re.S)
    assert match, f"no card for {node}"
    return match.group(0)


@pytest.fixture(autouse=True)
def _beats(settings):
    settings.SPARKOPS_HEARTBEAT_SECONDS = 10.0
    settings.SPARKOPS_UNREACHABLE_AFTER_BEATS = 3.0
    settings.SPARKOPS_COLLECT_INTERVAL = INTERVAL


# --- the read model ----------------------------------------------------------------------------


def test_each_engines_prefill_need_is_judged_against_the_headroom_with_the_margin():
    now = timezone.now()
    fleet_node("spark-a", now, available_gib=30, engines=(
        EngineSpec("gemma"), EngineSpec("mystery", need_per_token=None)))
    fleet_node("spark-b", now, available_gib=14)

    a, b = fleet_overview(now, INTERVAL).nodes

    gemma, mystery = a.prefill
    assert gemma.fits is True and gemma.spare_bytes == int(15.5 * GIB)
    assert gemma.text == ("gemma: prefill need 12.50 GiB — fits, 15.50 GiB to spare with the "
                          "2.00 GiB margin")
    assert mystery.fits is None and mystery.text.startswith("mystery: prefill need unknown — ")
    [squeezed] = b.prefill
    assert squeezed.fits is False
    assert squeezed.text.endswith("does not fit: 0.50 GiB short with the 2.00 GiB margin")
    assert a.headroom_text == "30.00 GiB"


def test_alerts_are_counted_by_severity_and_the_worst_is_summed_up():
    now = timezone.now()
    node = fleet_node("spark-a", now)
    fleet_node("spark-b", now)
    firing(node, "queue-backlog", "warning", "requests waited 20 s", 10, now)
    worst = firing(node, "headroom-floor", "critical", "MemAvailable below the floor", 300, now)
    Alert.objects.create(rule="engine-down", node=node, scope="pending", state=AlertState.PENDING,
                         severity="critical", summary="pending, not firing", threshold=0.5,
                         started_at=now, last_evaluated_at=now)

    a, b = fleet_overview(now, INTERVAL).nodes

    assert a.firing_by_severity == {"critical": 1, "warning": 1} and a.firing_count == 2
    assert a.worst == worst  # critical outranks the later warning
    assert (b.firing_count, b.worst, b.firing_by_severity) == (0, None, {})


def test_last_contact_is_the_heartbeat_else_the_last_collection_else_never():
    now = timezone.now()
    beating = fleet_node("spark-a", now, beat_age=4)
    silent = fleet_node("spark-b", now, beat_age=185)
    old_style = fleet_node("spark-c", now, beat_age=None)
    stale = fleet_node("spark-d", now, beat_age=None)
    Node.objects.filter(pk=stale.pk).update(last_collection_at=now - timedelta(minutes=10))
    stale.refresh_from_db()
    never = Node.objects.create(name="spark-e")

    contacts = {n.name: node_contact(n, now, INTERVAL)
                for n in (beating, silent, old_style, stale, never)}

    assert (contacts["spark-a"].state, contacts["spark-a"].text) == \
        ("reachable", "last contact 4 s ago (heartbeat)")
    assert contacts["spark-b"].state == "unreachable" and contacts["spark-b"].greyed
    assert contacts["spark-b"].text == "last contact 3 min 5 s ago (heartbeat)"
    assert (contacts["spark-c"].state, contacts["spark-c"].text) == \
        ("reachable", "last contact 3 s ago (last collection)")
    assert contacts["spark-d"].state == "stale" and contacts["spark-d"].greyed
    assert (contacts["spark-e"].state, contacts["spark-e"].text) == ("never", "never")


@pytest.mark.parametrize(("skew", "text", "warned"), [
    (0.4, "", False),
    (-1.0, "node clock 1.0 s behind the centre", False),
    (7.2, "node clock 7.2 s ahead of the centre", True),
    (-5.0, "node clock 5.0 s behind the centre", True),
    (None, "", False),
])
def test_clock_skew_is_shown_from_one_second_and_warned_from_five(skew, text, warned):
    now = timezone.now()
    node = Node(name="spark-a", heartbeat_at=now, clock_skew_seconds=skew)

    contact = node_contact(node, now, INTERVAL)

    assert clock_skew_text(skew) == contact.skew_text == text
    assert contact.skew_warned is warned


# --- the page ----------------------------------------------------------------------------------


def test_home_is_the_one_nodes_overview_and_the_fleet_once_there_is_a_second(admin_client):
    now = timezone.now()
    fleet_node("spark-b", now)

    response = admin_client.get("/")
    assert response.status_code == 302 and response["Location"] == "/nodes/spark-b/"
    overview = admin_client.get("/nodes/spark-b/").content.decode()
    assert 'id="fleet-link"' not in overview

    fleet_node("spark-a", now)
    response = admin_client.get("/")
    html = response.content.decode()
    assert response.status_code == 200 and "<h1>Fleet</h1>" in html
    assert '<a href="/fleet/" id="fleet-link">Fleet</a>' in html
    assert 'href="/nodes/spark-a/"' in html and 'href="/nodes/spark-b/"' in html
    assert 'id="fleet-link"' in admin_client.get("/nodes/spark-b/").content.decode()


def test_anonymous_users_are_sent_to_login_from_the_fleet(client, db):
    response = client.get("/fleet/")

    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


def test_the_fleet_page_shows_every_node_at_a_glance(admin_client):
    now = timezone.now()
    a = fleet_node("spark-a", now, skew=7.2, engines=(
        EngineSpec("gemma"), EngineSpec("nemotron", decode=23.2, prefill=None,
                                        phase="loading")))
    fleet_node("spark-b", now, available_gib=14)
    firing(a, "headroom-floor", "critical", "spark-a: MemAvailable 4.00 GiB below the floor",
           60, now)

    html = admin_client.get("/fleet/").content.decode()

    spark_a, spark_b = card(html, "spark-a"), card(html, "spark-b")
    assert "greyed" not in spark_a and 'data-contact="reachable"' in spark_a
    assert re.search(r"last contact \d s ago \(heartbeat\)", spark_a)
    assert '<span class="badge sev-warning">clock skew</span> node clock 7.2 s ahead of the ' \
           "centre" in spark_a
    assert "node clock" not in spark_b  # 0 s: not shown
    assert '<span class="badge sev-critical">1 critical</span>' in spark_a
    assert "spark-a: MemAvailable 4.00 GiB below the floor" in spark_a
    assert "none firing" in spark_b
    assert re.search(r'data-engine="gemma">.*?ready.*?41\.1 tok/s.*?2,400 tok/s', spark_a, re.S)
    assert re.search(r'data-engine="nemotron">.*?loading.*?23\.2 tok/s.*?unknown', spark_a,
                     re.S)
    assert 'href="/nodes/spark-a/engines/gemma/"' in spark_a
    assert "gemma: prefill need 12.50 GiB — fits" in spark_a
    assert '<span class="badge sev-critical">squeezed</span> gemma: prefill need 12.50 GiB — ' \
           "does not fit" in spark_b


def test_an_unreachable_node_keeps_its_last_known_state_greyed_and_aged(admin_client):
    now = timezone.now()
    fleet_node("spark-a", now)
    fleet_node("spark-b", now, beat_age=190, engines=(EngineSpec("gemma", decode=38.0),))

    html = admin_client.get("/fleet/").content.decode()

    silent = card(html, "spark-b")
    assert 'class="card node-card contact-unreachable greyed"' in silent
    assert '<span class="badge contact-badge">unreachable</span>' in silent
    assert re.search(r"last contact 3 min 1\d s ago \(heartbeat\)", silent)
    assert "its last known state, not the present" in silent
    assert "38.0 tok/s" in silent and "30.00 GiB" in silent  # still shown
    assert "1 unreachable" in html
    assert "greyed" not in card(html, "spark-a")


def test_the_overview_of_an_unreachable_node_says_it_shows_the_last_known_state(admin_client):
    now = timezone.now()
    fleet_node("spark-a", now, beat_age=3)
    fleet_node("spark-b", now, beat_age=200, skew=-6.0)

    reachable = admin_client.get("/nodes/spark-a/").content.decode()
    silent = admin_client.get("/nodes/spark-b/").content.decode()

    assert 'id="node-contact"' not in reachable and 'id="node-skew"' not in reachable
    banner = re.search(r'<div class="banner node-contact greyed" id="node-contact".*?</div>',
                       silent, re.S).group(0)
    assert "unreachable" in banner and re.search(r"last contact 3 min 2\d s ago", banner)
    assert "its last known state, not the present" in banner
    assert "node clock 6.0 s behind the centre" in silent


def test_the_fleet_page_costs_the_same_queries_for_two_nodes_and_for_sixteen(
        admin_client, django_assert_max_num_queries):
    now = timezone.now()
    four = tuple(EngineSpec(name) for name in ("gemma", "nemotron", "qwen", "whisper"))
    for i in range(2):
        node = fleet_node(f"spark-{i:02d}", now, engines=four)
        firing(node, "headroom-floor", "critical", "low", 10, now)
    with CaptureQueriesContext(connection) as two:
        assert admin_client.get("/fleet/").status_code == 200

    for i in range(2, 16):
        node = fleet_node(f"spark-{i:02d}", now, beat_age=200 if i % 5 == 0 else 2,
                          engines=four)
        firing(node, "headroom-floor", "critical", "low", 10, now)
    with django_assert_max_num_queries(len(two.captured_queries)):
        html = admin_client.get("/fleet/").content.decode()

    assert html.count('class="card node-card') == 16
    assert html.count('<tr data-engine="') == 64
    assert len(two.captured_queries) <= 10  # session, user, nodes, engines, alerts, settings
