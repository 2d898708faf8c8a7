"""Drift between nodes: versions and settings side by side, a row marked only when known values
differ (an unknown, a masked secret or an engine a node does not run is no difference), and
the engines spanning nodes whose ranks' kernels, drivers, CUDA or NCCL settings disagree."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from collectors.models import Node
from collectors.redaction import MASK
from dashboard.drift import drift_findings, drift_table
from dashboard.fleet import fleet_nodes
from tests.test_fleet_view import PORT, EngineSpec, facts, fleet_node

pytestmark = pytest.mark.django_db


def _rows(nodes=None) -> dict:
    return {row.key: row for row in drift_table(nodes if nodes is not None else fleet_nodes())}


def _texts(row) -> list[str]:
    return [cell.text for cell in row.cells]


def test_facts_that_differ_are_marked_and_unknowns_are_not_differences():
    now = timezone.now()
    fleet_node("spark-a", now, node_facts=facts(hostname="spark-a"))
    fleet_node("spark-b", now, node_facts=facts(hostname="spark-b", kernel="6.11.0-1014-nvidia",
                                                driver=None))
    fleet_node("spark-c", now, node_facts={})  # its worker never registered it

    rows = _rows()

    kernel = rows["fact:kernel"]
    assert kernel.differs and kernel.verdict == "differs"
    assert _texts(kernel) == ["6.11.0-1016-nvidia", "6.11.0-1014-nvidia",
                              "unknown — this node's worker has not registered it"]
    driver = rows["fact:driver"]
    assert not driver.differs and driver.verdict == "not compared"  # one known value only
    assert _texts(driver)[1] == "unknown — driver could not be read"
    assert driver.cells[1].unknown and driver.cells[2].unknown
    assert rows["fact:hostname"].verdict == "per node" and not rows["fact:hostname"].differs
    assert rows["fact:os"].verdict == "same"


def test_ports_compare_state_and_rate_apart_and_a_missing_port_differs():
    now = timezone.now()
    down = {**PORT, "state": "down", "rate_gbps": None, "rate_text": None,
            "unknown": "no link: the kernel gives no rate"}
    second = {**PORT, "name": "enP2p1s0f1np1"}
    fleet_node("spark-a", now, node_facts=facts(ports=[dict(PORT), second]))
    fleet_node("spark-b", now, node_facts=facts(ports=[down]))

    rows = _rows()

    state, rate = rows["port:enp1s0f0np0:state"], rows["port:enp1s0f0np0:rate"]
    assert state.differs and _texts(state) == ["up", "down"]
    assert not rate.differs and _texts(rate) == ["200000 Mb/s",
                                                 "unknown — no link: the kernel gives no rate"]
    missing = rows["port:enP2p1s0f1np1:state"]
    assert missing.differs and _texts(missing) == ["up", "no such port"]


def test_engines_compare_image_version_and_collective_environment():
    now = timezone.now()
    fleet_node("spark-a", now, engines=(
        EngineSpec("gemma", env={"PATH": "/a", "NCCL_IB_HCA": "mlx5_0", "HF_TOKEN": MASK,
                                 "CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "WARN"}),
        EngineSpec("whisper", version=None, image="")))
    fleet_node("spark-b", now, engines=(
        EngineSpec("gemma", version="0.32.1",
                   env={"PATH": "/b", "NCCL_IB_HCA": "mlx5_1", "HF_TOKEN": MASK,
                        "CUDA_VISIBLE_DEVICES": "0", "UCX_TLS": f"rc,{MASK}"}),))

    rows = _rows()

    assert rows["engine:gemma:version"].differs
    assert _texts(rows["engine:gemma:version"]) == ["0.33.0", "0.32.1"]
    assert rows["engine:gemma:image"].verdict == "same"
    assert rows["engine:gemma:env:NCCL_IB_HCA"].differs
    assert rows["engine:gemma:env:CUDA_VISIBLE_DEVICES"].verdict == "same"
    # Set on one node only: a difference; "not set" is known.
    assert _texts(rows["engine:gemma:env:NCCL_DEBUG"]) == ["WARN", "not set"]
    assert rows["engine:gemma:env:NCCL_DEBUG"].differs
    # A masked value is shown masked and compared with nothing.
    masked = rows["engine:gemma:env:UCX_TLS"]
    assert not masked.differs and masked.cells[1].text == f"rc,{MASK} (masked: not compared)"
    assert not any(key.endswith((":PATH", ":HF_TOKEN")) for key in rows)
    # An engine one node does not run, and what its kind did not report.
    whisper_version = rows["engine:whisper:version"]
    assert _texts(whisper_version) == ["unknown — vLLM has not reported its version",
                                       "not on this node"]
    assert whisper_version.verdict == "not compared"
    assert _texts(rows["engine:whisper:image"])[0] == \
        "unknown — the container engine gave no image"


def test_an_environment_never_read_is_unknown_not_unset():
    now = timezone.now()
    fleet_node("spark-a", now, engines=(EngineSpec("gemma", env={"NCCL_IB_HCA": "mlx5_0"}),))
    fleet_node("spark-b", now, engines=(EngineSpec("gemma", env={}),))

    row = _rows()["engine:gemma:env:NCCL_IB_HCA"]

    assert not row.differs
    assert _texts(row)[1] == "unknown — its container's environment has not been read"


def test_the_table_reads_no_more_than_the_prefetched_nodes(django_assert_num_queries):
    now = timezone.now()
    for name in ("spark-a", "spark-b", "spark-c"):
        fleet_node(name, now, engines=(EngineSpec("gemma"), EngineSpec("qwen")))
    nodes = fleet_nodes()

    with django_assert_num_queries(0):
        drift_table(nodes)
        drift_findings(nodes)


# --- engines spanning nodes -------------------------------------------------------------------


def _spanning(name: str, driver: str, *, cuda: str | None = "13.0", env: dict | None = None,
              span: str = "ray:gemma-tp2") -> Node:
    engine = EngineSpec("gemma", span_key=span,
                        env=env if env is not None else {"NCCL_SOCKET_IFNAME": "enp1s0f0np0"})
    return fleet_node(name, timezone.now(), engines=(engine,),
                      node_facts=facts(hostname=name, driver=driver, cuda=cuda))


def test_an_engine_spanning_nodes_whose_drivers_differ_is_a_finding():
    _spanning("spark-a", "580.95.05")
    _spanning("spark-b", "580.82.07", cuda=None)  # CUDA unknown there: no finding for it
    fleet_node("spark-c", timezone.now(), node_facts=facts(driver="575.57.08"))  # not spanned

    [finding] = drift_findings(fleet_nodes())

    assert finding.text == "gemma spans spark-a and spark-b, whose drivers differ: " \
                           "580.95.05 vs 580.82.07"
    assert finding.nodes == ("spark-a", "spark-b") and finding.span_key == "ray:gemma-tp2"


def test_three_ranks_and_an_nccl_setting_each_say_which_node_holds_what():
    _spanning("spark-a", "580.95.05", env={"NCCL_SOCKET_IFNAME": "enp1s0f0np0"})
    _spanning("spark-b", "580.95.05", env={"NCCL_SOCKET_IFNAME": "enp1s0f0np0"})
    _spanning("spark-c", "580.95.05", env={"NCCL_SOCKET_IFNAME": "enP2p1s0f1np1",
                                           "NCCL_IB_DISABLE": "1"})

    texts = [finding.text for finding in drift_findings(fleet_nodes())]

    assert texts == [
        "gemma spans spark-a, spark-b and spark-c, whose NCCL_IB_DISABLE settings differ: "
        "not set (spark-a, spark-b) vs 1 (spark-c)",
        "gemma spans spark-a, spark-b and spark-c, whose NCCL_SOCKET_IFNAME settings differ: "
        "enp1s0f0np0 (spark-a, spark-b) vs enP2p1s0f1np1 (spark-c)",
    ]


def test_ranks_that_agree_or_a_span_on_one_node_are_no_finding():
    _spanning("spark-a", "580.95.05")
    _spanning("spark-b", "580.95.05")
    _spanning("spark-c", "580.82.07", span="ray:alone")

    assert drift_findings(fleet_nodes()) == []


def test_the_fleet_page_tells_the_findings_and_marks_differing_rows_in_words(admin_client):
    _spanning("spark-a", "580.95.05")
    _spanning("spark-b", "580.82.07")

    html = admin_client.get("/fleet/").content.decode()

    findings = re.search(r'<div class="banner warn" id="drift-findings".*?</div>', html,
                         re.S).group(0)
    assert "gemma spans spark-a and spark-b, whose drivers differ: 580.95.05 vs 580.82.07" \
        in findings
    driver = re.search(r'<tr [^>]*data-row="fact:driver"[^>]*>.*?</tr>', html, re.S).group(0)
    assert 'class="verdict-differs differs"' in driver
    assert '<span class="badge drift-verdict">differs</span>' in driver
    kernel = re.search(r'<tr [^>]*data-row="fact:kernel"[^>]*>.*?</tr>', html, re.S).group(0)
    assert "differs" not in kernel and ">same<" in kernel
