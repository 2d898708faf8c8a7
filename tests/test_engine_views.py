"""Engine cards on the overview and the engine page."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from collectors.models import Engine, EngineMetric, EngineReading, Event
from collectors.readings import ENGINE, Sample

GIB = 1024**3


@pytest.fixture
def engine(node):
    return Engine.objects.create(
        node=node, name="gemma", container_id="a" * 64, container_state="running",
        phase="ready", command=["vllm", "serve", "google/gemma", "--max-num-seqs", "16"],
        config={"model": "google/gemma", "served_model_name": "gemma", "max_num_seqs": 16,
                "kv_cache_memory_bytes": 20 * GIB,
                "all_flags": {"max-num-seqs": "16", "kv-cache-memory-bytes": "20G"}},
        startup={"phase": "ready", "version": "0.33.0", "kv_cache_gib": 20.0,
                 "kv_cache_pinned": True, "kv_cache_tokens": 1230000, "max_concurrency": 9.39,
                 "concurrency_for_tokens": 131072, "backends": ["Marlin"], "errors": []},
        findings=[{"code": "enforce-eager", "severity": "info", "message": "CUDA graphs off"},
                  {"code": "stale-bind-mount", "severity": "error", "message": "recreate it"}],
        metrics={"snapshot": {"model_name": "gemma", "requests_running": 3,
                              "requests_waiting": 0, "kv_cache_usage": 0.25}},
        rates={"prefill_tokens_per_s": 1884.2, "decode_tokens_per_s": None, "restarted": False},
    )


def test_overview_shows_engine_cards_with_unknowns_as_unknown(admin_client, engine):
    page = admin_client.get("/nodes/spark-a/").content.decode()

    assert "gemma" in page and "vLLM 0.33.0" in page
    assert "20.0 GiB (pinned)" in page
    assert "9.39× at 131072 tok" in page
    assert "25.0 %" in page
    assert "3 / 0 of 16 slots" in page
    assert "1,884 tok/s" in page  # humanised: whole tok/s from 100 up
    decode = page.split('data-field="decode">')[1].split("<")[0]
    assert decode == "unknown"  # no rate yet: not 0
    assert page.index("stale-bind-mount") < page.index("enforce-eager")  # errors first


def test_engine_cards_fragment_and_json(admin_client, engine):
    fragment = admin_client.get("/nodes/spark-a/engines/cards/")
    data = admin_client.get("/api/nodes/spark-a/engines.json").json()

    assert fragment.status_code == 200 and "<html" not in fragment.content.decode()
    card = data["engines"][0]
    assert card["kv_tokens"] == 1230000 and card["decode_tps"] is None
    assert card["kv_usage_pct"] == 25.0


def test_container_engine_errors_are_shown(admin_client, node):
    node.engine_discovery_error = "no container engine at unix:///run/docker.sock"
    node.save()

    page = admin_client.get("/nodes/spark-a/").content.decode()

    assert "Engines cannot be listed: no container engine at unix:///run/docker.sock" in page


def test_engine_page_shows_launch_config_startup_and_events(admin_client, engine):
    Event.objects.create(node=engine.node, engine=engine, at=timezone.now(),
                         kind="engine-restarted", message="restarted; counters reset")

    page = admin_client.get("/nodes/spark-a/engines/gemma/").content.decode()

    assert "--kv-cache-memory-bytes" in page and "20G" in page
    assert "pinned by --kv-cache-memory-bytes" in page
    assert "restarted; counters reset" in page
    assert "Marlin" in page


def test_engine_series_json_has_rates_and_restart_markers(admin_client, engine):
    now = timezone.now()
    EngineReading.objects.bulk_create([
        ENGINE.reading(engine, now - timedelta(seconds=5 * i), [
            Sample(EngineMetric.DECODE_TPS, now - timedelta(seconds=5 * i), 40.0 + i)])
        for i in range(10)
    ])
    Event.objects.create(node=engine.node, engine=engine, at=now - timedelta(seconds=12),
                         kind="engine-restarted", message="restart")

    data = admin_client.get("/api/nodes/spark-a/engines/gemma/series.json?range=1h").json()

    decode = next(s for s in data["series"] if s["key"] == "decode_tps")
    assert len(decode["y"]) == 10 and min(decode["y"]) == 40.0
    assert data["events"][0]["kind"] == "engine-restarted"
    assert data["max_num_seqs"] == 16


def test_engine_pages_need_login_and_known_names(admin_client, engine):
    anonymous = Client()
    assert anonymous.get("/nodes/spark-a/engines/gemma/").status_code == 302
    assert anonymous.get("/api/nodes/spark-a/engines.json").status_code == 302
    assert anonymous.get("/nodes/spark-a/engines/cards/").status_code == 302
    assert admin_client.get("/nodes/spark-a/engines/nope/").status_code == 404
    assert admin_client.get(
        "/api/nodes/spark-a/engines/gemma/series.json?range=9y").status_code == 400


def test_gpu_panel_shows_not_supported_and_no_driver_as_states(admin_client, node):
    import json
    from pathlib import Path

    node.gpu = {"state": "no_driver", "reason": "no NVIDIA driver: libnvidia-ml.so.1 not found"}
    node.save()
    page = admin_client.get("/nodes/spark-a/").content.decode()
    assert "GPU: no NVIDIA driver: libnvidia-ml.so.1 not found" in page

    h200 = json.loads((Path(__file__).parent / "fixtures/nvml/h200_real.json").read_text())
    gb10 = json.loads(json.dumps(h200))
    gb10["devices"][0].update(name="NVIDIA GB10", memory={"state": "not_supported"},
                              utilization_gpu_pct=None, unsupported=["utilization_gpu_pct"])
    node.gpu = gb10
    node.save()
    page = admin_client.get("/nodes/spark-a/").content.decode()
    assert "NVIDIA GB10" in page
    assert "memory not reported by NVML (unified memory: see host memory)" in page
    assert "util not supported" in page
    assert "0 bytes" not in page and " 0 %" not in page

    node.gpu = h200
    node.save()
    page = admin_client.get("/nodes/spark-a/").content.decode()
    assert "36 °C" in page and "1980 MHz" in page and "of 140.4" in page


def test_an_admin_can_enable_management_of_an_engine(admin_client, engine):
    page = admin_client.get("/admin/collectors/engine/")
    assert page.status_code == 200 and "gemma" in page.content.decode()

    response = admin_client.post(f"/admin/collectors/engine/{engine.pk}/change/",
                                 {"managed": "on", "prefill_bytes_per_token": "65536"})

    assert response.status_code == 302
    engine.refresh_from_db()
    assert engine.manageable and engine.prefill_bytes_per_token == 65536
