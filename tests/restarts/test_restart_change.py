"""Restart plans that carry a change of flags: what planning accepts and refuses, what the plan
keeps, and what the runbook's pre-check makes of it on the ledger of its own moment.

The node is the fit planner's seed (tests/test_planner.py): Gemma-4 with a pinned 20 GiB pool
next to Nemotron with 8 GiB, 30 GiB available. The pre-check runs against a real container (a
sleeper started through Podman's Docker API), the node's real /proc and the ledger stored for
it, so the runbook's own steps decide, not a stand-in.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from collectors import docker_api
from collectors import fitplan as planner
from collectors.ledger import build_ledger
from collectors.models import Engine, Node
from collectors.procfs import Procfs
from dashboard.audit.models import AuditEntry
from dashboard.restarts.change import (
    NOTE,
    RECREATE,
    FlagChange,
    command_words,
    flag_differences,
    ledger_summary,
    planned_ledger,
    refusal_at_precheck,
    runs_intended,
)
from dashboard.restarts.models import Restart
from dashboard.restarts.planning import PLAN_ACTION, PlanRefused, plan_restart
from dashboard.restarts.runbook import run_restart
from tests.containers import run_container, unique_name
from tests.test_planner import (
    GEMMA_COMMAND,
    GEMMA_MODEL,
    MARGIN,
    NEMOTRON_COMMAND,
    plan_for,
    seed_node,
)

pytestmark = pytest.mark.django_db

GIB = 1024**3
GEMMA = "gemma-4-26b"
NEMOTRON = "nemotron-120b"
GEMMA_16G = GEMMA_COMMAND.replace("20G", "16G")
GEMMA_22G = GEMMA_COMMAND.replace("20G", "22G")
NEMOTRON_24G = NEMOTRON_COMMAND.format(kv="24G", util="0.8")


@pytest.fixture
def seeded() -> Node:
    node = seed_node()
    Engine.objects.filter(node=node).update(managed=True)
    return node


@pytest.fixture
def admin():
    return get_user_model().objects.create_superuser("root", "", None)


def engine(node: Node, name: str) -> Engine:
    return Engine.objects.get(node=node, name=name)


def plan_change(node: Node, name: str, command: str, user, *, mode: str = NOTE,
                accept_squeeze: bool = False) -> Restart:
    return plan_restart(engine(node, name), user=user, now=timezone.now(), reason="new flags",
                        change=FlagChange(command, mode, MARGIN, accept_squeeze))


def refusal(node: Node, name: str, command: str, user, **options) -> str:
    with pytest.raises(PlanRefused) as refused:
        plan_change(node, name, command, user, **options)
    assert not Restart.objects.filter(engine__name=name).exists()
    return refused.value.reason


# --- planning ------------------------------------------------------------------------------------


def test_a_plan_keeps_the_intended_command_its_margin_and_the_predicted_after_ledger(seeded,
                                                                                      admin):
    restart = plan_change(seeded, GEMMA, GEMMA_16G, admin)

    change = restart.change
    assert change["command"] == GEMMA_16G.split()
    assert change["mode"] == NOTE and change["margin_bytes"] == MARGIN
    assert change["accept_squeeze"] is False
    planned = change["planned"]
    assert planned["verdict"] == planner.FITS
    assert planned["verdict_text"].startswith("Fits:")
    # The headroom grows by the 4 GiB the smaller pool hands back.
    assert [f["value"] for f in planned["headroom"]] == [30 * GIB, 34 * GIB]
    rows = {row["name"]: row for row in planned["rows"]}
    assert rows[GEMMA]["planned"] and not rows[NEMOTRON]["planned"]
    assert [f["value"] for f in rows[GEMMA]["kv_pool"]] == [20 * GIB, 16 * GIB]
    assert rows[GEMMA]["fits"] == [True, True]
    assert 0 < rows[GEMMA]["kv_tokens"][1]["value"] < rows[GEMMA]["kv_tokens"][0]["value"]
    allowed = AuditEntry.objects.get(action=PLAN_ACTION, allowed=True)
    assert allowed.details["change"]["mode"] == NOTE
    assert allowed.details["predicted"] == planner.FITS


def test_a_squeeze_of_a_neighbour_is_refused_naming_it_unless_the_admin_accepts_it(seeded,
                                                                                    admin):
    reason = refusal(seeded, NEMOTRON, NEMOTRON_24G, admin)

    assert reason.startswith(f"the new flags squeeze {GEMMA}'s prefill")
    assert "accept the squeeze" in reason
    refused = AuditEntry.objects.get(action=PLAN_ACTION, allowed=False)
    assert refused.outcome == reason and refused.details["change"]["accept_squeeze"] is False

    accepted = plan_change(seeded, NEMOTRON, NEMOTRON_24G, admin, accept_squeeze=True)
    assert accepted.change["accept_squeeze"] is True
    assert accepted.change["planned"]["verdict"] == planner.SQUEEZES
    # Nemotron's KV tokens after the change are unknown (its Mamba layers), kept as words.
    nemotron = next(r for r in accepted.change["planned"]["rows"] if r["name"] == NEMOTRON)
    assert nemotron["kv_tokens"][1]["value"] is None
    assert nemotron["kv_tokens"][1]["confidence"].startswith("unknown — ")
    assert accepted.change["planned"]["unknown_reasons"]


def test_flags_the_engine_would_refuse_to_start_with_or_that_exhaust_the_host_are_refused(
        seeded, admin):
    refuses = refusal(seeded, NEMOTRON, NEMOTRON_COMMAND.format(kv="24G", util="0.9"), admin)
    out_of_memory = refusal(seeded, NEMOTRON, NEMOTRON_COMMAND.format(kv="40G", util="0.8"),
                            admin, accept_squeeze=True)

    assert refuses.startswith("the engine would refuse to start: free memory at boot")
    assert "--gpu-memory-utilization 0.9" in refuses
    assert out_of_memory.startswith("the host would run out of memory: the engine would take")


def test_flags_the_planner_cannot_read_refuse_the_plan_with_its_words(seeded, admin):
    unknown_model = refusal(seeded, GEMMA, "vllm serve unknown/model --kv-cache-memory-bytes 1G",
                            admin)
    unclosed = refusal(seeded, GEMMA, "vllm serve 'gemma", admin)
    empty_mode = refusal(seeded, GEMMA, GEMMA_16G, admin, mode="sometime")

    assert unknown_model.startswith("the new flags cannot be planned: unknown model "
                                    "unknown/model")
    assert unclosed.startswith("the new flags cannot be planned:")
    assert empty_mode.startswith("unknown way to apply the new flags 'sometime'")


def test_recreating_a_compose_container_or_with_a_masked_secret_is_refused(seeded, admin):
    Engine.objects.filter(name=GEMMA).update(
        labels={"com.docker.compose.project": "inference", "sparkops.engine": "vllm"})
    compose = refusal(seeded, GEMMA, GEMMA_16G, admin, mode=RECREATE)
    masked = refusal(seeded, NEMOTRON, NEMOTRON_COMMAND.format(kv="8G", util="0.8")
                     + " --api-key ••••••", admin, mode=RECREATE)

    assert "belongs to compose project inference" in compose
    assert compose.endswith('plan the restart with "note"')
    assert "masked" in masked and '"note"' in masked
    # As a note, the compose container's plan is made: the admin recreates it.
    assert plan_change(seeded, GEMMA, GEMMA_16G, admin, mode=NOTE).change["mode"] == NOTE


def test_recreating_through_the_least_privilege_proxy_is_refused_before_anything_stops(
        seeded, admin, monkeypatch):
    monkeypatch.setenv("SPARKOPS_DOCKER_HOST", "unix:///run/sparkops-docker/docker.sock")
    refused = refusal(seeded, GEMMA, GEMMA_16G, admin, mode=RECREATE)

    assert "least-privilege Docker API proxy" in refused and '"note"' in refused
    with pytest.raises(docker_api.ContainerEngineError, match="refuses creating, renaming"):
        docker_api.check_recreatable(None, "c" * 64, ["vllm"])  # before any call to the engine
    monkeypatch.setenv("SPARKOPS_DOCKER_HOST", "unix:///run/podman/podman.sock")
    assert plan_change(seeded, GEMMA, GEMMA_16G, admin, mode=RECREATE).change["mode"] == RECREATE


def test_a_compose_service_is_read_as_its_command_words():
    service = ("services:\n  gemma:\n    image: vllm/vllm-openai:v0.33.0\n"
               f"    command: {GEMMA_MODEL} --kv-cache-memory-bytes 16G\n")

    assert command_words(service) == ["vllm", "serve", GEMMA_MODEL, "--kv-cache-memory-bytes",
                                      "16G"]


# --- what the pre-check and the record step compare ----------------------------------------------


def test_only_a_verdict_worse_than_the_one_accepted_stops_the_pre_check(seeded):
    squeezes = plan_for(seeded, NEMOTRON, NEMOTRON_24G)
    fits = plan_for(seeded, GEMMA, GEMMA_16G)
    refuses = plan_for(seeded, NEMOTRON, NEMOTRON_COMMAND.format(kv="24G", util="0.9"))

    assert refusal_at_precheck(fits, accepted_squeeze=False) is None
    assert refusal_at_precheck(squeezes, accepted_squeeze=True) is None
    assert refusal_at_precheck(squeezes, accepted_squeeze=False) == (
        f"the new flags would now squeeze {GEMMA}'s prefill, a squeeze not accepted when it "
        "was planned")
    assert refusal_at_precheck(refuses, accepted_squeeze=True).startswith(
        "the engine would now refuse to start:")


def test_the_stored_after_ledger_reads_back_as_the_planners_figures(seeded):
    result = plan_for(seeded, NEMOTRON, NEMOTRON_24G)

    ledger = planned_ledger(ledger_summary(result))

    assert ledger.verdict == result.verdict and ledger.headroom == result.headroom
    for stored, row in zip(ledger.rows, result.rows, strict=True):
        assert (stored.name, stored.kv_pool, stored.kv_tokens, stored.fits, stored.verdict) == \
            (row.name, row.kv_pool, row.kv_tokens, row.fits, row.verdict)
    assert ledger.unknown_reasons == result.unknown_reasons


def test_flags_compare_as_vllm_reads_them():
    now = GEMMA_COMMAND.split()
    same = GEMMA_COMMAND.replace("20G", "20G --enforce-eager").split()

    assert runs_intended(now, GEMMA_COMMAND.replace("--max-model-len 131072",
                                                    "--max-model-len=131072").split())[0]
    intended, text = runs_intended(now, GEMMA_16G.split())
    assert intended is False and "--kv-cache-memory-bytes 20G (intended 16G)" in text
    differences, _ = flag_differences(now, same)
    assert [(d.flag, d.now, d.intended) for d in differences] == [("--enforce-eager", None, "")]
    assert runs_intended(now, ["sleep", "300"])[0] is None


# --- the pre-check, against a real container -----------------------------------------------------


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


@pytest.fixture
def sleeper(seeded, api) -> str:
    """Gemma's container: a real one that only sleeps (it is stopped by a run that gets that
    far, never started again: its health endpoint is not known)."""
    container_id = run_container(unique_name("gemma"), ["sleep", "600"])
    Engine.objects.filter(node=seeded, name=GEMMA).update(container_id=container_id)
    return container_id


def available(node: Node, gib: float) -> None:
    """The node's ledger now, with ``gib`` GiB available (as a collection would store it)."""
    figures = {"mem_total": node.mem_total_bytes, "mem_available": int(gib * GIB),
               "mem_available_min": int(gib * GIB), "page_cache_reclaimable": 0, "swap_used": 0}
    node.ledger = build_ledger(node, timezone.now(), figures, list(node.engines.all()),
                               []).as_dict()
    node.save(update_fields=["ledger"])


def run(restart: Restart, api) -> Restart:
    return run_restart(restart.pk, api=api, procfs=Procfs(Path("/proc")), poll_seconds=0.1)


def precheck(restart: Restart) -> dict:
    return restart.steps.get(step="precheck").data


@pytest.mark.slow
def test_the_pre_check_refuses_a_squeeze_that_appeared_since_planning(seeded, admin, api,
                                                                      sleeper):
    restart = plan_change(seeded, GEMMA, GEMMA_22G, admin)  # fits on today's 30 GiB
    available(seeded, 7)  # Nemotron's 4 GiB prefill fits with 2 GiB margin, not 2 GiB later

    restart = run(restart, api)

    assert restart.status == Restart.Status.REFUSED
    assert restart.outcome == (f"Pre-check of the new flags: the new flags would now squeeze "
                               f"{NEMOTRON}'s prefill, a squeeze not accepted when it was "
                               "planned; nothing was touched.")
    found = precheck(restart)["change"]["plan"]
    assert found["verdict"] == planner.SQUEEZES
    assert [f["value"] for f in found["headroom"]] == [7 * GIB, 5 * GIB]
    assert list(restart.steps.values_list("step", flat=True)) == ["precheck", "record"]
    assert api.api.inspect_container(sleeper)["State"]["Running"] is True


@pytest.mark.slow
def test_the_pre_check_refuses_flags_the_engine_would_now_refuse_to_start_with(seeded, admin,
                                                                               api, sleeper):
    restart = plan_change(seeded, GEMMA, GEMMA_22G, admin, accept_squeeze=True)
    # Gemma holds 35.2 GiB; with 1 GiB more free, 36.2 GiB is less than 0.3 of the host.
    available(seeded, 1)

    restart = run(restart, api)

    assert restart.status == Restart.Status.REFUSED
    assert restart.outcome.startswith("Pre-check of the new flags: the engine would now refuse "
                                      "to start: free memory at boot")
    assert precheck(restart)["change"]["plan"]["verdict"] == planner.REFUSES
    assert api.api.inspect_container(sleeper)["State"]["Running"] is True


@pytest.mark.slow
def test_without_a_ledger_the_pre_check_of_new_flags_is_not_possible(seeded, admin, api,
                                                                     sleeper):
    restart = plan_change(seeded, GEMMA, GEMMA_16G, admin)
    Node.objects.filter(pk=seeded.pk).update(ledger={})

    restart = run(restart, api)

    assert restart.status == Restart.Status.ABORTED
    assert restart.outcome == (f"Pre-check of the new flags not possible: node {seeded.name} "
                               "has no memory ledger yet: wait for its first host-memory "
                               "collection; nothing was touched.")
    assert "no memory ledger" in precheck(restart)["change"]["error"]


@pytest.mark.slow
def test_recreating_checks_the_container_and_the_memory_check_counts_the_new_pool(seeded,
                                                                                 admin, api,
                                                                                 sleeper):
    recreate = plan_change(seeded, GEMMA, GEMMA_22G, admin, mode=RECREATE)
    # The sleeper runs from the host's file system, not an image: it cannot be recreated.
    recreate = run(recreate, api)
    assert recreate.status == Restart.Status.REFUSED
    assert recreate.outcome.startswith("Pre-check: cannot recreate ")
    assert "it was not created from an image" in recreate.outcome

    # As a note the container restarts with its command: the check counts today's 20 GiB pool;
    # 7 GiB available + 35.2 GiB it holds cannot take the 47.7 GiB it needs.
    note = plan_change(seeded, GEMMA, GEMMA_22G, admin, mode=NOTE, accept_squeeze=True)
    available(seeded, 7)
    note = run(note, api)
    assert note.status == Restart.Status.ABORTED, note.outcome
    data = precheck(note)
    assert data["parts"]["kv_pool"] == 20 * GIB and data["fits"] is False
    assert data["change"]["plan"]["verdict"] == planner.SQUEEZES


def test_read_only_mode_refuses_recreation_before_the_engine_is_asked(settings):
    settings.SPARKOPS_READ_ONLY = True
    recreated = docker_api.Recreated(name="gemma", container_id="new" * 8,
                                     replaced_id="old" * 8, replaced_name="gemma-old")

    # No container engine at all: a refusal that asked it would fail otherwise.
    for call in (lambda: docker_api.recreate_with_command(None, "old" * 8, ["vllm", "serve"]),
                 lambda: docker_api.restore_replaced(None, recreated),
                 lambda: docker_api.discard_replaced(None, recreated)):
        with pytest.raises(docker_api.ReadOnlyRefused) as refused:
            call()
        assert docker_api.READ_ONLY_TEXT in str(refused.value)
