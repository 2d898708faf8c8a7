"""The read-only JSON API: documented shapes, nulls for unknowns, and 400s that say why."""

from __future__ import annotations

import pytest

from collectors.models import Node
from dashboard.exports.api import CARD_FIELDS
from tests.exports.world import GIB, MIB, World

MEMORY_KEYS = {
    "mem_available_bytes", "mem_available_interval_min_bytes", "mem_free_bytes",
    "page_cache_reclaimable_bytes", "swap_used_bytes", "psi_some_avg10_ratio",
    "psi_full_avg10_ratio", "headroom_bytes",
}


def get(client, bearer, path: str, params: dict[str, str] | None = None, *,
        expect: int = 200) -> dict:
    response = client.get(path, params or {}, headers=bearer)
    assert response.status_code == expect, response.content
    assert response["Content-Type"] == "application/json"
    return response.json()


def test_nodes_list_with_headroom_figures(client, bearer, world: World):
    payload = get(client, bearer, "/api/v1/nodes")

    assert list(payload) == ["nodes"]
    [node] = payload["nodes"]
    assert set(node) == {"name", "hostname", "mem_total_bytes", "collection", "memory",
                         "unknown_reasons", "alerts_firing", "links"}
    assert node["name"] == "spark-a"
    assert node["mem_total_bytes"] == world.node.mem_total_bytes
    assert set(node["collection"]) == {"at", "age_seconds", "ok", "error", "stale"}
    assert node["collection"]["ok"] is True and node["collection"]["error"] is None
    assert node["collection"]["stale"] is False
    assert node["memory"] == {
        "mem_available_bytes": 40 * GIB,
        "mem_available_interval_min_bytes": 38 * GIB,
        "mem_free_bytes": None,
        "page_cache_reclaimable_bytes": 10 * GIB,
        "swap_used_bytes": 0,
        "psi_some_avg10_ratio": 0.125,
        "psi_full_avg10_ratio": None,
        "headroom_bytes": 38 * GIB,
    }
    assert node["unknown_reasons"] == {
        "mem_free_bytes": "unreadable value 'n/a'",
        "psi_full_avg10_ratio": "no 'full' line in /proc/pressure/memory",
    }
    assert node["alerts_firing"] == 1
    assert node["links"] == {"ledger": "/api/v1/nodes/spark-a/ledger",
                             "engines": "/api/v1/nodes/spark-a/engines",
                             "restarts": "/api/v1/nodes/spark-a/restarts"}


def test_a_node_never_collected_has_nulls_and_says_why(client, bearer, db):
    Node.objects.create(name="spark-b")

    [node] = get(client, bearer, "/api/v1/nodes")["nodes"]

    assert node["mem_total_bytes"] is None
    assert node["collection"] == {"at": None, "age_seconds": None, "ok": None, "error": None,
                                  "stale": True}
    assert node["memory"] == dict.fromkeys(MEMORY_KEYS)
    assert node["unknown_reasons"]["mem_available_bytes"] == "no collection yet"
    assert node["alerts_firing"] == 0


def test_the_ledger(client, bearer, world: World):
    payload = get(client, bearer, "/api/v1/nodes/spark-a/ledger")

    ledger = payload["ledger"]
    assert payload["node"] == "spark-a"
    assert set(ledger) == {
        "at", "age_seconds", "mem_total_bytes", "mem_available_bytes",
        "mem_available_interval_min_bytes", "headroom_bytes", "page_cache_reclaimable_bytes",
        "swap_used_bytes", "others_bytes", "engines", "processes",
    }
    assert ledger["headroom_bytes"] == 38 * GIB
    assert ledger["others_bytes"] == 2 * GIB
    gemma, nemotron = ledger["engines"]
    assert gemma == {
        "engine": "gemma", "model": "gemma-4-26b", "weights_bytes": 15 * GIB,
        "kv_pool_bytes": 8 * GIB, "cuda_graphs_bytes": 512 * MIB,
        "reserved_bytes": 23 * GIB + 512 * MIB, "actual_bytes": 24 * GIB,
        "non_kv_bytes": 16 * GIB, "prefill_estimate_bytes": 2 * GIB,
        "prefill_observed_bytes": 3 * GIB, "prefill_need_bytes": 3 * GIB,
        "prefill_need_source": "observed",
    }
    assert nemotron["weights_bytes"] == 20 * GIB
    assert nemotron["kv_pool_bytes"] is None and nemotron["reserved_bytes"] is None
    assert nemotron["prefill_need_bytes"] is None and nemotron["prefill_need_source"] is None
    assert ledger["processes"] == [{"name": "python3", "rss_bytes": 2 * GIB, "count": 2}]


def test_no_ledger_yet_is_null(client, bearer, node):
    assert get(client, bearer, "/api/v1/nodes/spark-a/ledger") == {"node": "spark-a",
                                                                   "ledger": None}


def test_engine_cards(client, bearer, world: World):
    payload = get(client, bearer, "/api/v1/nodes/spark-a/engines")

    engines = {engine["name"]: engine for engine in payload["engines"]}
    assert set(engines) == {"gemma", "nemotron", "qwen"}
    for engine in engines.values():
        assert set(engine) == {*CARD_FIELDS, "scrape_up"}
    gemma = engines["gemma"]
    assert gemma["model"] == "gemma-4-26b" and gemma["phase"] == "ready"
    assert gemma["running"] == 3 and gemma["waiting"] == 1 and gemma["max_num_seqs"] == 8
    assert gemma["kv_usage_pct"] == 25.0 and gemma["decode_tps"] == 42.5
    assert gemma["scrape_up"] is True
    assert engines["qwen"]["scrape_up"] is False
    assert engines["qwen"]["scrape_error"] == "connection refused"
    assert engines["nemotron"]["scrape_up"] is None
    assert engines["nemotron"]["max_num_seqs"] is None  # unknown, not 0


def test_gone_engines_are_not_listed(client, bearer, world: World):
    world.qwen.present = False
    world.qwen.save()

    payload = get(client, bearer, "/api/v1/nodes/spark-a/engines")

    assert [engine["name"] for engine in payload["engines"]] == ["gemma", "nemotron"]


@pytest.mark.parametrize("path", ["/api/v1/nodes/spark-z/ledger", "/api/v1/nodes/spark-z/engines",
                                  "/api/v1/nodes/spark-z/restarts"])
def test_an_unknown_node_is_404_with_a_reason(client, bearer, db, path):
    assert get(client, bearer, path, expect=404) == {"error": "no node named 'spark-z'"}


def test_alerts_newest_first_with_their_figures(client, bearer, world: World):
    payload = get(client, bearer, "/api/v1/alerts")

    assert payload["limit"] == 100
    assert [(a["rule"], a["state"]) for a in payload["alerts"]] == [
        ("headroom-floor", "pending"), ("prefill-squeeze", "firing"),
        ("engine-down", "resolved"), ("overcommit", "resolved"),
    ]
    firing = payload["alerts"][1]
    assert set(firing) == {
        "id", "rule", "node", "engine", "scope", "state", "severity", "summary", "cause",
        "value", "threshold", "clear", "direction", "details", "started_at", "fired_at",
        "resolved_at", "last_evaluated_at", "resolve_reason",
    }
    assert firing["node"] == "spark-a" and firing["engine"] == "gemma"
    assert firing["cause"] == "qwen's KV pool went 8 → 24 GiB at 14:02"
    assert firing["value"] == 1.5 and firing["threshold"] == 2.0 and firing["clear"] is None
    assert firing["resolved_at"] is None and firing["fired_at"] is not None
    assert payload["alerts"][0]["engine"] is None


@pytest.mark.parametrize("state, rules", [
    ("firing", ["prefill-squeeze"]),
    ("pending", ["headroom-floor"]),
    ("resolved", ["engine-down", "overcommit"]),
])
def test_alerts_by_state(client, bearer, world: World, state, rules):
    payload = get(client, bearer, "/api/v1/alerts", {"state": state})

    assert [alert["rule"] for alert in payload["alerts"]] == rules


def test_alerts_by_node_and_limit(client, bearer, world: World):
    Node.objects.create(name="spark-b")

    assert get(client, bearer, "/api/v1/alerts", {"node": "spark-b"})["alerts"] == []
    limited = get(client, bearer, "/api/v1/alerts", {"node": "spark-a", "limit": "2"})
    assert limited["limit"] == 2 and len(limited["alerts"]) == 2


@pytest.mark.parametrize("query, reason", [
    ("state=open", "state must be one of pending, firing, resolved, not 'open'"),
    ("stat=firing", "unknown query parameter 'stat'; this endpoint takes state, node, limit"),
    ("state=firing&state=pending", "state is given 2 times; give it once"),
    ("limit=0", "limit must be a whole number from 1 to 1000, not '0'"),
    ("limit=1001", "limit must be a whole number from 1 to 1000, not '1001'"),
    ("limit=ten", "limit must be a whole number from 1 to 1000, not 'ten'"),
    ("node=spark-z", "node: no node named 'spark-z'"),
])
def test_bad_alert_queries_are_400_with_the_reason(client, bearer, world: World, query, reason):
    response = client.get(f"/api/v1/alerts?{query}", headers=bearer)

    assert response.status_code == 400
    assert response.json() == {"error": reason}


def test_endpoints_without_parameters_refuse_any(client, bearer, world: World):
    response = client.get("/api/v1/nodes?verbose=1", headers=bearer)

    assert response.status_code == 400
    assert response.json() == {
        "error": "unknown query parameter 'verbose'; this endpoint takes no query parameters"}


def test_the_restart_ledger(client, bearer, world: World):
    payload = get(client, bearer, "/api/v1/nodes/spark-a/restarts")

    assert payload["node"] == "spark-a" and payload["limit"] == 100
    assert [(r["engine"], r["kind"], r["status"]) for r in payload["restarts"]] == [
        ("gemma", "unplanned", "detected"), ("qwen", "planned", "failed"),
        ("gemma", "planned", "succeeded"),
    ]
    succeeded = payload["restarts"][2]
    assert set(succeeded) == {
        "id", "engine", "kind", "status", "reason", "window", "requested_by", "requested_at",
        "scheduled_for", "expected_drain_seconds", "expected_startup_seconds",
        "expected_back_by", "started_at", "finished_at", "deadline", "phase", "outcome",
        "startup_seconds", "before", "after",
    }
    assert succeeded["reason"] == "new weights" and succeeded["startup_seconds"] == 512.5
    assert succeeded["window"] is None and succeeded["requested_by"] is None
    assert payload["restarts"][1]["outcome"] == "not ready by the deadline"
    assert payload["restarts"][0]["startup_seconds"] is None


@pytest.mark.parametrize("query, expected", [
    ({"kind": "planned"}, [("qwen", "failed"), ("gemma", "succeeded")]),
    ({"status": "detected"}, [("gemma", "detected")]),
    ({"engine": "gemma", "kind": "planned"}, [("gemma", "succeeded")]),
    ({"engine": "nemotron"}, []),
    ({"limit": "1"}, [("gemma", "detected")]),
])
def test_restarts_filtered(client, bearer, world: World, query, expected):
    payload = get(client, bearer, "/api/v1/nodes/spark-a/restarts", query)

    assert [(r["engine"], r["status"]) for r in payload["restarts"]] == expected


@pytest.mark.parametrize("query, reason", [
    ("kind=manual", "kind must be one of planned, unplanned, not 'manual'"),
    ("status=done", "status must be one of scheduled, running, succeeded, failed, aborted, "
                    "interrupted, refused, cancelled, detected, not 'done'"),
    ("engine=llama", "engine: no engine named 'llama' on spark-a"),
    ("since=1h", "unknown query parameter 'since'; this endpoint takes kind, status, engine, "
                 "limit"),
])
def test_bad_restart_queries_are_400_with_the_reason(client, bearer, world: World, query,
                                                     reason):
    response = client.get(f"/api/v1/nodes/spark-a/restarts?{query}", headers=bearer)

    assert response.status_code == 400
    assert response.json() == {"error": reason}


def test_head_is_served_like_get(client, bearer, world: World):
    response = client.head("/api/v1/nodes", headers=bearer)

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
