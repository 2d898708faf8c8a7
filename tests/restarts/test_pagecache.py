"""Dropping the page cache: the no-argument helper, its sudoers rule, and the gate in front of it
(never while the engine runs, a cooldown, an audit row for every attempt)."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone

from collectors.docker_api import GONE, ContainerEngineError, ContainerStatus
from collectors.pagecache import DropFailed, drop_command
from dashboard.audit.models import AuditEntry
from dashboard.restarts import pagecache
from dashboard.restarts.pagecache import DropRefused, drop_page_cache, last_successful_drop
from tests.conftest import PROJECT
from tests.restarts.plan_factories import make_engine
from tests.restarts.runbook_helpers import fill_page_cache

HELPER = PROJECT / "bin" / "sparkops-drop-caches"
SUDOERS = PROJECT / "bin" / "sparkops-drop-caches.sudoers"
RUNNING = ContainerStatus(state="running", running=True, started_at=None, exit_code=None,
                          oom_killed=False, pid=42)
EXITED = ContainerStatus(state="exited", running=False, started_at=None, exit_code=0,
                         oom_killed=False, pid=None)


# --- the helper and its sudoers rule -------------------------------------------------------------


def test_the_helper_refuses_any_argument():
    result = subprocess.run([str(HELPER), "--all"], capture_output=True, text=True, timeout=10)

    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == "sparkops-drop-caches: takes no arguments (got 1)\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping the page cache needs root")
def test_the_helper_drops_the_cache_and_prints_cached_before_and_after(tmp_path):
    fill_page_cache(tmp_path / "cache-filler", 64 * 1024**2)

    result = subprocess.run([str(HELPER)], capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["Cached before", "Cached after"]
    before, after = (int(line.split()[2]) for line in lines)
    assert before - after >= 32 * 1024  # kB: most of the 64 MiB just read is gone


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"),
                    reason="needs root to switch to an unprivileged user")
def test_the_helper_run_without_root_says_so():
    result = subprocess.run(["runuser", "-u", "nobody", "--", str(HELPER)], capture_output=True,
                            text=True, timeout=10)

    assert result.returncode == 1
    assert result.stderr.strip() == "sparkops-drop-caches: must run as root (through sudo)"


@pytest.mark.skipif(not shutil.which("visudo"), reason="visudo (Debian package sudo) missing")
def test_visudo_accepts_the_sudoers_drop_in():
    result = subprocess.run(["visudo", "-cf", str(SUDOERS)], capture_output=True, text=True,
                            timeout=10)

    assert result.returncode == 0, result.stdout + result.stderr


def test_the_sudoers_rule_allows_one_command_without_arguments():
    rules = [line for line in SUDOERS.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]

    assert rules == [
        'Cmnd_Alias SPARKOPS_DROP_CACHES = /usr/local/sbin/sparkops-drop-caches ""',
        "sparkops ALL = (root) NOPASSWD: SPARKOPS_DROP_CACHES",
    ]


def test_the_command_goes_through_sudo_unless_root(settings, monkeypatch):
    settings.SPARKOPS_DROP_CACHES_COMMAND = ["/usr/local/sbin/sparkops-drop-caches"]
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert drop_command() == ["/usr/local/sbin/sparkops-drop-caches"]
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert drop_command() == ["sudo", "-n", "/usr/local/sbin/sparkops-drop-caches"]


# --- the gate -------------------------------------------------------------------------------------


@pytest.fixture
def helper(tmp_path, settings, monkeypatch):
    """A stand-in helper that records each run; its behaviour is a shell snippet."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # no sudo in front of the stand-in
    ran = tmp_path / "ran"

    def make(body: str = 'echo "Cached before: 1048576 kB"; echo "Cached after: 4096 kB"'):
        script = tmp_path / "fake-drop-caches"
        script.write_text(f"#!/bin/sh\necho run >> {ran}\n{body}\n")
        script.chmod(0o755)
        settings.SPARKOPS_DROP_CACHES_COMMAND = [str(script)]
        return ran

    return make


@pytest.fixture
def container(monkeypatch):
    """What the container engine says about the engine's container (set per test)."""
    state: dict[str, object] = {"status": EXITED}

    def status(api, container_id):
        if isinstance(state["status"], Exception):
            raise state["status"]
        return state["status"]

    monkeypatch.setattr(pagecache, "container_status", status)
    return state


def test_a_drop_for_a_stopped_engine_runs_and_is_audited(node, helper, container):
    ran = helper()
    engine = make_engine(node, "gemma")

    result = drop_page_cache(engine=engine, restart=None, actor="worker:spark-a", api=None)

    assert (result.cached_before, result.cached_after) == (1024**3, 4096 * 1024)
    assert ran.read_text() == "run\n"
    entry = AuditEntry.objects.get(action="drop-caches")
    assert entry.allowed and entry.details["ok"] is True
    assert entry.details["cached_before_bytes"] == 1024**3
    assert entry.outcome == "dropped: Cached 1024 MiB → 4 MiB"
    assert entry.actor == "worker:spark-a" and entry.engine == engine and entry.node == node


@pytest.mark.parametrize("state", [RUNNING, ContainerEngineError("socket gone")])
def test_never_while_the_engine_runs_or_may_run(node, helper, container, state):
    ran = helper()
    container["status"] = state

    with pytest.raises(DropRefused) as refused:
        drop_page_cache(engine=make_engine(node, "gemma"), restart=None, actor="a", api=None)

    assert not ran.exists()
    entry = AuditEntry.objects.get(action="drop-caches")
    assert entry.allowed is False and entry.outcome == str(refused.value)


def test_a_gone_container_does_not_block_the_drop(node, helper, container):
    helper()
    container["status"] = GONE
    assert drop_page_cache(engine=make_engine(node, "gemma"), restart=None, actor="a",
                           api=None).freed is not None


def test_a_second_drop_within_the_cooldown_is_refused(node, helper, container, settings):
    settings.SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS = 300
    ran = helper()
    engine = make_engine(node, "gemma")
    first = timezone.now()
    drop_page_cache(engine=engine, restart=None, actor="a", api=None, now=first)

    with pytest.raises(DropRefused, match=r"cooldown is 300 s \(next in 180 s\)"):
        drop_page_cache(engine=engine, restart=None, actor="a", api=None,
                        now=first + timedelta(seconds=120))
    drop_page_cache(engine=engine, restart=None, actor="a", api=None,
                    now=first + timedelta(seconds=301))

    assert ran.read_text() == "run\nrun\n"
    assert list(AuditEntry.objects.order_by("pk").values_list("allowed", flat=True)) == \
        [True, False, True]


def test_the_cooldown_is_per_node(node, helper, container, settings):
    settings.SPARKOPS_DROP_CACHES_COOLDOWN_SECONDS = 300
    helper()
    other = type(node).objects.create(name="spark-b")
    drop_page_cache(engine=make_engine(node, "a"), restart=None, actor="a", api=None)

    drop_page_cache(engine=make_engine(other, "a"), restart=None, actor="a", api=None)

    assert last_successful_drop(other.pk) is not None


def test_a_failed_drop_is_audited_and_starts_no_cooldown(node, helper, container):
    helper('echo "sparkops-drop-caches: sync failed" >&2; exit 1')
    engine = make_engine(node, "gemma")

    with pytest.raises(DropFailed, match="exited with status 1: sparkops-drop-caches: sync failed"):
        drop_page_cache(engine=engine, restart=None, actor="a", api=None)

    entry = AuditEntry.objects.get(action="drop-caches")
    assert entry.allowed is True and entry.details["ok"] is False
    assert last_successful_drop(node.pk) is None


def test_a_helper_that_hangs_is_stopped_at_the_timeout(node, helper, container):
    helper("sleep 30")

    with pytest.raises(DropFailed, match=r"did not finish within 0.5 s"):
        drop_page_cache(engine=make_engine(node, "gemma"), restart=None, actor="a", api=None,
                        timeout_seconds=0.5)


def test_a_missing_helper_is_a_failed_drop(node, container, settings, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    settings.SPARKOPS_DROP_CACHES_COMMAND = ["/nonexistent/sparkops-drop-caches"]

    with pytest.raises(DropFailed, match="cannot run /nonexistent/sparkops-drop-caches"):
        drop_page_cache(engine=make_engine(node, "gemma"), restart=None, actor="a", api=None)

