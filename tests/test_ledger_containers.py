"""The ledger finds an engine container's processes from the container's own cgroup, as the
discovery found it: the same PIDs that reading every process's cgroup file finds."""

from __future__ import annotations

import pytest

from collectors import docker_api
from collectors.ledger import _engine_processes_by_walk, engine_processes
from tests.containers import run_container, unique_name

pytestmark = [pytest.mark.slow]


@pytest.fixture
def api(docker_host):
    client = docker_api.client(docker_host)
    yield client
    client.close()


def test_engine_pids_from_the_containers_cgroup_are_the_host_walks(api):
    # A container whose first process has children of its own, and a second one beside it.
    first = run_container(unique_name("tree"), ["sh", "-c", "sleep 300 & sleep 300 & wait"],
                          labels={"sparkops.engine": "vllm"})
    second = run_container(unique_name("lone"), ["sleep", "300"],
                           labels={"sparkops.engine": "vllm"})
    docker_api.discover_engines(api)
    assert docker_api.memory_cgroup(first) is not None
    assert docker_api.memory_cgroup(second) is not None

    found = engine_processes({first, second})

    assert found == _engine_processes_by_walk({first, second})
    assert len(found[first]) == 3 and len(found[second]) == 1
    assert found[first] == sorted(found[first])


def test_a_container_the_discovery_did_not_see_is_found_by_the_host_walk(api):
    seen = run_container(unique_name("seen"), ["sleep", "300"],
                         labels={"sparkops.engine": "vllm"})
    docker_api.discover_engines(api)
    unseen = run_container(unique_name("unseen"), ["sleep", "300"],
                           labels={"sparkops.engine": "vllm"})
    assert docker_api.memory_cgroup(unseen) is None

    found = engine_processes({seen, unseen})

    assert found == _engine_processes_by_walk({seen, unseen})
    assert len(found[seen]) == 1 and len(found[unseen]) == 1
