"""The engine collection's cheaper paths give what the plain ones give.

Each faster way of doing one step of ``collectors.engines.collect_engines`` is held here against
the way it replaced: the exposition filter against a line-by-line filter (on every engine
exposition and on mutated lines of them), the raw UPDATE of an engine's changed fields against
``save(update_fields=...)``, the raw INSERT of readings against ``bulk_create``, the raw reads
of a node's engines and of the starts to look at against the ORM's, the copy of launch settings
against ``copy.deepcopy``, the kept container-engine client, the list call over its socket
against docker-py's own (on one socket) and the remembered missing NVML library. Runs on SQLite
and, with ``DATABASE_URL``, on PostgreSQL.
"""

from __future__ import annotations

import copy
import json
import random
import socketserver
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import docker
import docker.errors
import pynvml
import pytest
from django.db import DatabaseError, connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from collectors import docker_api, nvml, promtext
from collectors.engines import _json_copy, _node_engines, _write_changed
from collectors.models import Engine, EngineMetric, EngineReading, EngineStart
from collectors.readings import Sample, engine_readings
from collectors.starts import starts_to_look_at
from collectors.vllm import metrics
from sparkops.rowwrites import insert_rows
from tests.nvml.stand_in import StandInNvml, gb10

FIXTURES = Path(__file__).parent / "fixtures"
EXPOSITIONS = sorted([*FIXTURES.glob("vllm_metrics/*.txt"), FIXTURES / "sglang/metrics.txt",
                      FIXTURES / "trtllm/prometheus.txt", FIXTURES / "llamacpp/metrics.txt"])


# --- the exposition filter ---------------------------------------------------------------------


def line_by_line(text: str) -> str:
    """The filter as it was written before: every line looked at in Python."""
    kept = []
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("#"):
            parts = stripped.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") \
                    and parts[2] not in metrics._USED_FAMILIES:
                continue
        else:
            name = metrics._SAMPLE_NAME.match(stripped)
            after = stripped[name.end():name.end() + 1] if name is not None else ""
            plain = after in (" ", "\t") or (after == "{" and "}" in stripped)
            if plain and name.group() not in metrics._USED:
                continue
        kept.append(line)
    return "\n".join(kept)


@pytest.mark.parametrize("path", EXPOSITIONS, ids=lambda path: path.parent.name + "/" + path.name)
def test_the_filter_keeps_the_lines_the_line_by_line_filter_keeps(path):
    text = path.read_text()
    assert metrics._used_lines(text) == line_by_line(text)


EDGE_LINES = [
    "", " ", "\t", "\x0c", "#", "# ", "# HELP", "#HELP vllm:num_requests_running x",
    "# HELP vllm:num_requests_running Running.", "# TYPE vllm:num_requests_running gauge",
    "# HELP  vllm:num_requests_running two blanks", "# HELP\tvllm:num_requests_running tab",
    "# HELP vllm:num_requests_running", "# HELP vllm:num_requests_running\r",
    "# HELP vllm:num_requests_running(x) y", "# HELP vllm:num_requests_runningx y",
    "# TYPE other_family counter", "# HELP other_family \"quoted\\n\"", "# HELP other_family",
    "# HELP other_family\x0cformfeed", "  # HELP other_family indented", "# EOF", "# just words",
    'vllm:num_requests_running{engine="0",model_name="m"} 1',
    'vllm:num_requests_running {engine="0"} 1', "vllm:num_requests_running 1",
    "vllm:num_requests_running", "vllm:num_requests_running  ", "vllm:num_requests_runningx 1",
    'vllm:num_requests_running{engine="0" 1', "  vllm:num_requests_running 1",
    'other_metric{a="1"} 2', "other_metric 2", "other_metric", "other_metric   ",
    "other_metric \x0c", "other_metric\x0c2", "other_metric{ 1", 'other_metric{a=unquoted} 1',
    "other_metric 1\r", "other_metric\t1", "  other_metric 1", "other_metric \xa0",
    'other_metric{a="}"} 1', "1bad 2", "<html>", '{"detail":"Not Found"}', ":colon 1",
    "process_start_time_seconds 1.7e9", "process_start_time_seconds_x 1",
    "vllm:prompt_tokens_total 5", "vllm:prompt_tokens_created 1.7e9", "vllm:prompt_tokens 5",
    'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 3', "vllm:cache_config_info{} 1",
]


def test_the_filter_agrees_on_every_edge_form_alone_and_between_lines():
    for line in EDGE_LINES:
        for text in (line, line + "\n", f"a 1\n{line}\nb 2\n", f"{line}\n{line}\n"):
            assert metrics._used_lines(text) == line_by_line(text), repr(text)


def test_the_filter_agrees_on_mutated_expositions():
    chooser = random.Random(20261207)
    mutations = [
        lambda line: " " + line, lambda line: line + " ", lambda line: line + "\r",
        lambda line: line.replace(" ", "\t", 1), lambda line: line.replace("{", "", 1),
        lambda line: line.replace("}", "", 1), lambda line: line.replace("# ", "#", 1),
        lambda line: line.replace(" ", "  ", 1), lambda line: line.replace("vllm:", "vllm:x", 1),
        lambda line: line.replace("_total", "", 1), lambda line: line[: len(line) // 2],
        lambda line: line.split(" ")[0], lambda line: line + "\x0c", lambda line: "",
        lambda line: chooser.choice(EDGE_LINES),
    ]
    for path in EXPOSITIONS:
        lines = path.read_text().split("\n")
        for _ in range(40):
            mutated = list(lines)
            for index in chooser.sample(range(len(mutated)), k=min(25, len(mutated))):
                mutated[index] = chooser.choice(mutations)(mutated[index])
            text = "\n".join(mutated)
            assert metrics._used_lines(text) == line_by_line(text), path.name


def test_the_parse_reads_the_same_snapshots_through_either_filter(monkeypatch):
    for path in sorted(FIXTURES.glob("vllm_metrics/*.txt")):
        text = path.read_text()
        fast = [snapshot.as_dict() for snapshot in metrics.parse_engines(text)]
        monkeypatch.setattr(metrics, "_used_lines", line_by_line)
        assert [snapshot.as_dict() for snapshot in metrics.parse_engines(text)] == fast
        monkeypatch.undo()


@pytest.mark.parametrize("value", ["3", "3.0", "-0", "+5", "007", "1.5e3", "1E5", "2e-3", ".5",
                                   "5.", "+Inf", "-Inf", "NaN", "inf", "1e400", "12345678901234567"
                                   "890123", "\u0663", "0x10", "1_0", "one", "1.2.3", "e5"])
def test_each_value_reads_as_the_library_reads_it(value):
    text = f"a {value}\n"
    try:
        expected = [float(sample.value) for family in text_string_to_metric_families(text)
                    for sample in family.samples]
    except ValueError as error:
        expected = f"ValueError: {error}"
    try:
        ours = [value for _, _, value in promtext.samples(text, {"a"})]
    except ValueError as error:
        ours = f"ValueError: {error}"
    assert str(ours) == str(expected)


def test_labels_read_again_are_each_samples_own():
    text = '# TYPE a gauge\na{x="1"} 1\na{x="1"} 2\n'
    first, second = promtext.samples(text, {"a"})
    assert first[1] == second[1] == {"x": "1"} and first[1] is not second[1]
    with pytest.raises(ValueError):  # a refused label set is refused every time
        promtext.samples('a{x="1",x="2"} 1\n', {"a"})
    with pytest.raises(ValueError):
        promtext.samples('a{x="1",x="2"} 1\n', {"a"})


# --- the copy of launch settings ----------------------------------------------------------------


def test_the_json_copy_equals_deepcopy_and_shares_nothing():
    value = {"model": "m", "all_flags": {"port": 8000, "enforce-eager": True, "x": None},
             "list": [1, [2, {"3": 4.5}]], "pair": (1, [2])}
    copied = _json_copy(value)
    assert copied == copy.deepcopy(value)
    copied["all_flags"]["port"] = 1
    copied["list"][1][1]["3"] = 0
    copied["pair"][1].append(3)
    assert value["all_flags"]["port"] == 8000 and value["list"][1][1]["3"] == 4.5
    assert value["pair"] == (1, [2])


# --- the database ---------------------------------------------------------------------------------


@pytest.fixture
def engines(node) -> list[Engine]:
    at = timezone.now().replace(microsecond=0)
    return [Engine.objects.create(node=node, name=name, container_id=name * 8,
                                  container_state="running", started_at=at, first_seen=at,
                                  metrics={"snapshot": {"a": 1}}, config={"model": "m"})
            for name in ("b-engine", "a-engine", "c-engine")]


def _row(engine: Engine) -> dict:
    fresh = Engine.objects.get(pk=engine.pk)
    return {field.attname: getattr(fresh, field.attname) for field in Engine._meta.concrete_fields}


@pytest.mark.django_db
def test_changed_fields_are_written_as_save_writes_them(engines):
    by_raw, by_save = engines[0], engines[1]
    at = timezone.now().replace(microsecond=0) + timedelta(seconds=5)
    changes = {"metrics": {"snapshot": {"a": 2, "nested": [1, None, "x"]}, "wall_time": 1.5},
               "rates": {}, "findings": [], "last_scrape_at": at, "last_scrape_error": "",
               "memory_usage_bytes": None, "exit_code": 137, "present": False,
               "config": {"model": "m", "ü": "ß"}, "span": {}}
    for engine in (by_raw, by_save):
        for name, value in changes.items():
            setattr(engine, name, value)
    with CaptureQueriesContext(connection) as captured:
        _write_changed([(by_raw, list(changes)), (engines[2], [])])
    assert len(captured.captured_queries) == 1  # the unchanged engine is not written
    written = captured.captured_queries[0]["sql"]
    assert written.startswith("UPDATE") and "container_state" not in written
    by_save.save(update_fields=list(changes))
    raw_row, saved_row = _row(by_raw), _row(by_save)
    for name in changes:
        assert raw_row[name] == saved_row[name] == changes[name], name
    assert _row(engines[2])["metrics"] == {"snapshot": {"a": 1}}


@pytest.mark.django_db
def test_writing_an_engine_deleted_meanwhile_fails_as_save_does(engines):
    engine = engines[0]
    Engine.objects.filter(pk=engine.pk).delete()
    engine.phase = "ready"
    with pytest.raises(DatabaseError, match="did not affect any rows"):
        _write_changed([(engine, ["phase"])])


@pytest.mark.django_db
def test_readings_are_inserted_as_bulk_create_inserts_them(engines):
    at = timezone.now().replace(microsecond=0)
    samples = [(engine, Sample(metric, at, value))
               for engine in engines[:2]
               for metric, value in ((EngineMetric.REQUESTS_RUNNING, 3.0),
                                     (EngineMetric.CONTAINER_MEMORY, 2.5 * 2**30),
                                     (EngineMetric.TTFT_P95, None))]
    insert_rows(engine_readings(samples))
    ours = list(EngineReading.objects.order_by("engine_id").values())
    EngineReading.objects.all().delete()
    EngineReading.objects.bulk_create(engine_readings(samples))
    theirs = list(EngineReading.objects.order_by("engine_id").values())
    assert len(ours) == 2
    assert [{**row, "id": None} for row in ours] == [{**row, "id": None} for row in theirs]
    with CaptureQueriesContext(connection) as captured:
        insert_rows([])
    assert not captured.captured_queries


@pytest.mark.django_db
def test_the_node_engines_are_read_as_the_orm_reads_them(engines, node):
    other_node = type(node).objects.create(name="spark-b", hostname="spark-b")
    Engine.objects.create(node=other_node, name="a-engine", container_id="x", container_state="x")
    ours = _node_engines(node)
    theirs = list(Engine.objects.filter(node=node))
    assert [engine.name for engine in ours] == ["a-engine", "b-engine", "c-engine"]
    assert [_fields(engine) for engine in ours] == [_fields(engine) for engine in theirs]
    assert all(not engine._state.adding and engine._state.db == "default" for engine in ours)


def _fields(engine: Engine) -> dict:
    return {field.attname: getattr(engine, field.attname)
            for field in Engine._meta.concrete_fields}


# --- the container engine's client and NVML --------------------------------------------------


class _Api:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def containers(self, **_: object) -> list[dict]:
        if self.fail:
            raise docker.errors.DockerException("engine went away")
        return []


class _Client:
    closed = False

    def __init__(self, fail: bool = False) -> None:
        self.api = _Api(fail)

    def close(self) -> None:
        self.closed = True


def test_the_collection_client_is_kept_until_a_discovery_fails(monkeypatch):
    made: list[_Client] = []
    monkeypatch.setattr(docker_api, "_kept_clients", {})
    monkeypatch.setattr(docker_api, "client", lambda url=None: made.append(_Client()) or made[-1])
    monkeypatch.setenv("SPARKOPS_DOCKER_HOST", "unix:///nowhere.sock")
    first = docker_api.kept_client()
    assert docker_api.kept_client() is first and len(made) == 1
    assert docker_api.discover_engines(first) == []
    first.api.fail = True
    with pytest.raises(docker_api.ContainerEngineError, match="engine went away"):
        docker_api.discover_engines(first)
    assert first.closed
    assert docker_api.kept_client() is not first and len(made) == 2
    monkeypatch.setenv("SPARKOPS_DOCKER_HOST", "unix:///elsewhere.sock")
    assert docker_api.kept_client() is not made[1]  # one client per address


def test_a_missing_nvml_library_is_remembered_for_a_while(monkeypatch):
    calls = []

    def init() -> None:
        calls.append(1)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(nvml, "_no_library_until", 0.0)
    monkeypatch.setattr(pynvml, "nvmlInit", init)
    first = nvml.read_gpus(host_memory_bytes=1)
    second = nvml.read_gpus(host_memory_bytes=1)
    assert first.as_dict() == second.as_dict()
    assert (first.state, first.reason) == ("no_driver",
                                           "no NVIDIA driver: libnvidia-ml.so.1 not found")
    assert len(calls) == 1
    # A stand-in (tests, the registration's caller) is always asked.
    assert nvml.read_gpus(StandInNvml([gb10()]), host_memory_bytes=2**40).state == "ok"
    monkeypatch.setattr(nvml, "_no_library_until", 0.0)  # the while has passed: asked again
    nvml.read_gpus(host_memory_bytes=1)
    assert len(calls) == 2


# --- the list call over the container engine's socket -----------------------------------------


class _Engine:
    """A container engine on a Unix socket: answers every GET with ``reply`` and ``status``,
    and records each request's path and User-Agent, and each connection."""

    def __init__(self, path: Path) -> None:
        self.requests: list[tuple[str, str | None]] = []
        self.connections = 0
        self.reply: object = [{"Id": "abc", "Names": ["/x"], "State": "exited"}]
        self.status = 200
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                engine.connections += 1
                super().setup()

            def do_GET(self) -> None:  # noqa: N802 (the library's name)
                engine.requests.append((self.path, self.headers.get("User-Agent")))
                body = json.dumps(engine.reply).encode()
                self.send_response(engine.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def address_string(self) -> str:
                return "unix"

            def log_message(self, *args: object) -> None:
                pass

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def socket_engine(tmp_path, monkeypatch):
    monkeypatch.setattr(docker_api, "_list_connections", {})
    engine = _Engine(tmp_path / "engine.sock")
    client = docker.DockerClient(base_url=f"unix://{tmp_path / 'engine.sock'}", version="1.41")
    yield engine, client
    client.close()
    engine.close()


@pytest.mark.parametrize("selector", [[], ["sparkops.node=spark-b", "tier"]])
def test_the_list_call_is_docker_pys_own(socket_engine, selector):
    engine, client = socket_engine
    filters = {"label": selector} if selector else None
    theirs = client.api.containers(all=True, filters=filters)
    ours = docker_api._listed_over_socket(client, filters)
    assert ours == theirs == engine.reply
    assert engine.requests[0] == engine.requests[1]  # the same path, query and User-Agent
    assert docker_api._listed_over_socket(client, filters) == theirs
    assert engine.connections == 2  # docker-py's, and ours kept for the next call


def test_an_engine_error_is_docker_pys_error(socket_engine, monkeypatch):
    engine, client = socket_engine
    engine.status, engine.reply = 500, {"message": "database is locked"}
    assert docker_api._listed_over_socket(client, None) is None
    monkeypatch.setattr(docker_api, "_forget_kept_clients", lambda: None)
    with pytest.raises(docker_api.ContainerEngineError) as caught:
        docker_api.discover_engines(client)
    assert str(caught.value).startswith("container engine error: 500 Server Error")
    assert "database is locked" in str(caught.value)
    engine.status, engine.reply = 200, {"not": "a list"}
    assert docker_api._listed_over_socket(client, None) is None


def test_a_closed_kept_connection_is_opened_again(socket_engine):
    engine, client = socket_engine
    assert docker_api._listed_over_socket(client, None) == engine.reply
    engine.close()
    docker_api._list_connections[client.api.adapters["http+docker://"].socket_path].sock.close()
    assert docker_api._listed_over_socket(client, None) is None  # nobody answers: docker-py asks


@pytest.mark.django_db
def test_the_starts_to_look_at_are_those_the_orm_finds(engines, node):
    at = timezone.now()
    for index, (engine, outcome) in enumerate(zip(engines, ("starting", "ready", "gone"),
                                                  strict=True)):
        for start in range(2):
            EngineStart.objects.create(engine=engine, node=node, identity=f"{engine.name}@{start}",
                                       seen_at=at, outcome=outcome if start else "ready",
                                       config={"model": "m", "n": index}, actual={"x": [start]})
    other = type(node).objects.create(name="spark-b", hostname="spark-b")
    stranger = Engine.objects.create(node=other, name="x", container_id="x", container_state="x")
    EngineStart.objects.create(engine=stranger, node=other, identity="a-engine@0", seen_at=at)
    for identities in ([], ["b-engine@0"], ["a-engine@0", "c-engine@1", "nowhere"]):
        ours = sorted(starts_to_look_at(node, identities), key=lambda start: start.pk)
        theirs = list(EngineStart.objects.filter(
            Q(identity__in=identities) | Q(outcome=EngineStart.Outcome.STARTING), node=node)
            .order_by("pk"))
        assert [_start_fields(start) for start in ours] == \
            [_start_fields(start) for start in theirs], identities


def _start_fields(start) -> dict:
    return {field.attname: getattr(start, field.attname)
            for field in type(start)._meta.concrete_fields}
