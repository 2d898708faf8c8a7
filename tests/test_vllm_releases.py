"""SparkOps' vLLM readers against vLLM's own source, one minor release at a time (0.6-0.33).

Every fixture in tests/fixtures/vllm_releases/ was extracted from a release's source
distribution (extract.py, run by hand): the format strings of the startup lines and failures
SparkOps reads, with their file and line, example lines rendered from them with chosen values,
the release's Prometheus metric definitions and its ``vllm serve`` flags. Here each rendered line
is read by collectors/vllm/logs.py behind every log prefix the release prints, field by field;
an exposition rendered with prometheus_client from each release's metric definitions is read by
collectors/vllm/metrics.py; each flag is parsed by collectors/vllm/flags.py; and the
``removed-flag`` finding is judged against the engine's own version.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from collectors.enginecard import engine_card
from collectors.models import Engine
from collectors.vllm import flag_history
from collectors.vllm.findings import check_config
from collectors.vllm.flags import _FLAGS, parse_command_line
from collectors.vllm.logs import StartupLog, parse_startup_log
from collectors.vllm.metrics import MetricsSnapshot, parse_engines

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm_releases"
REPO = Path(__file__).resolve().parent.parent


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.replace("post", "").split(".") if part.isdigit())


@cache
def releases() -> tuple[dict[str, Any], ...]:
    found = [json.loads(path.read_text(encoding="utf-8")) for path in FIXTURES.glob("*.json")]
    return tuple(sorted(found, key=lambda data: _version_key(data["version"])))


@cache
def extractor() -> ModuleType:
    """The extraction tool, for the outputs it derives from the fixtures alone."""
    sys.path.insert(0, str(FIXTURES))
    spec = importlib.util.spec_from_file_location("vllm_release_extract", FIXTURES / "extract.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _log_cases() -> list[Any]:
    return [
        pytest.param(data, entry, id=f"{data['version']}-{entry['item']}-{entry['file']}:"
                                     f"{entry['line']}")
        for data in releases()
        for entry in data["log_lines"]
    ]


def _release_cases() -> list[Any]:
    return [pytest.param(data, id=data["version"]) for data in releases()]


def test_every_minor_release_from_0_6_to_the_newest_has_a_fixture() -> None:
    minors = [int(data["version"].split(".")[1]) for data in releases()]
    assert minors == list(range(6, minors[-1] + 1))
    assert minors[-1] >= 33
    for data in releases():
        assert data["tag"] == f"v{data['version']}"
        assert data["source"]["license"] == "Apache-2.0"
        assert len(data["source"]["sha256"]) == 64


# --- rendering lines as vLLM prints them ------------------------------------------------------

TIMESTAMP = "11-03 08:14:02"
LEVELS = {"raise": "ERROR", "assert": "ERROR", "debug": "DEBUG", "info": "INFO",
          "warning": "WARNING", "error": "ERROR", "critical": "CRITICAL"}  # fmt: skip


def _records(data: dict[str, Any], entry: dict[str, Any], message: str) -> dict[str, str]:
    """The message behind each prefix style vLLM prints, one text per style.

    vLLM's NewLineFormatter (vllm/logging_utils/formatter.py) repeats the prefix on every line
    of a multi-line message; a raised error reaches the log as its traceback's last line.
    """
    fields = {
        "levelname": LEVELS[entry["level"]],
        "asctime": TIMESTAMP,
        "filename": entry["file"].rsplit("/", 1)[-1],
        "fileinfo": entry["file"].rsplit("/", 1)[-1],
        "lineno": entry["line"],
        "process": 212,
        "vllm_process_name": "EngineCore_DP0",
        "message": "",
    }
    own_format = data["logging"]["format"]
    header = own_format % fields
    bracketed = f"{fields['levelname']} {TIMESTAMP} [{fields['fileinfo']}:{entry['line']}] "
    bare = f"{fields['levelname']} {TIMESTAMP} {fields['fileinfo']}:{entry['line']}] "
    styles = {
        "own format": header,
        "APIServer": "(APIServer pid=1) " + bracketed,
        "EngineCore_DP0": "(EngineCore_DP0 pid=212) " + bracketed,
        "VllmWorker, no brackets": "(VllmWorker rank=0 pid=301) " + bare,
        "no process, no brackets": bare,
        "compose": "gemma-1  | (EngineCore pid=98) " + bracketed,
    }
    for site in data["logging"].get("process_prefix", []):
        # The release's own worker prefix, e.g. f"{CYAN}({worker_name} pid={pid}){RESET} "
        # (vllm/utils/__init__.py), in front of its own header.
        template = site.split(" ", 1)[1].removeprefix("f").strip("'\"")
        prefix = (template.replace("{CYAN}", "\x1b[1;36m").replace("{RESET}", "\x1b[0;0m")
                  .replace("{worker_name}", "VllmWorkerProcess").replace("{pid}", "301"))
        styles[f"own worker prefix ({site.split(' ', 1)[0]})"] = prefix + header
    return {
        name: "\n".join(prefix + line for line in message.split("\n")) + "\n"
        for name, prefix in styles.items()
    }


def _assert_expected(log: StartupLog, example: dict[str, Any], style: str) -> None:
    where = f"({style})"
    for name, expected in example["expect"].items():
        actual = getattr(log, name)
        if name in ("non_default_args", "engine_config"):
            assert actual is not None, where
            for key, value in expected.items():
                assert actual.get(key) == value, f"{name}[{key!r}] {where}"
        elif name == "backends":
            for backend in expected:
                assert backend in actual, where
        else:
            assert actual == expected, f"{name} {where}"
    if "error" in example:
        assert example["error"] in [error.kind for error in log.errors], where
        assert log.phase == "failed", where
    elif "phase" in example:
        assert log.phase == example["phase"], where
    assert log.unparsed == [], f"a line vLLM prints was reported as unparsed {where}"


@pytest.mark.parametrize(("data", "entry"), _log_cases())
def test_startup_line_is_read_field_by_field(data: dict[str, Any], entry: dict[str, Any]) -> None:
    example = entry["example"]
    for style, text in _records(data, entry, example["message"]).items():
        log = parse_startup_log(text)
        _assert_expected(log, example, style)
        if example.get("recognised", True):
            assert log.started_at == TIMESTAMP, f"the line was not recognised ({style})"
        else:
            assert not log.recognised, f"a line of something else was read ({style})"


@pytest.mark.parametrize(
    ("data", "entry"),
    [case for case in _log_cases() if "near_miss" in case.values[1]],
)
def test_near_miss_is_reported_not_read(data: dict[str, Any], entry: dict[str, Any]) -> None:
    near = entry["near_miss"]
    for style, text in _records(data, entry, near["message"]).items():
        log = parse_startup_log(text)
        assert getattr(log, near["field"]) is None, f"{near['field']} was read ({style})"
        reported = [line.message.rstrip("…") for line in log.unparsed]
        assert any(
            near["message"].split("\n")[-1].startswith(text) or text in near["message"]
            for text in reported
        ), f"not reported as unparsed ({style}): {log.unparsed}"


@pytest.mark.django_db
def test_engine_card_shows_the_unparsed_line(node: Any) -> None:
    """Where the engine's startup is shown, a figure left unknown says which line it was."""
    newest = releases()[-1]
    entry = next(e for e in newest["log_lines"] if e["item"] == "kv_available")
    log = parse_startup_log(_records(newest, entry, entry["near_miss"]["message"])["APIServer"])
    config = parse_command_line("vllm serve org/m")
    engine = Engine.objects.create(
        node=node, name="v", container_id="e" * 64, container_state="running",
        startup=log.as_dict(), findings=[f.as_dict() for f in check_config(config, log=log)],
    )
    card = engine_card(engine)
    assert card["kv_gib"] is None and card["kv_text"] == "unknown"
    assert card["startup_unparsed"] == [
        {"fact": "kv_cache_gib", "message": entry["near_miss"]["message"]}
    ]
    assert "log-line-unparsed" in [finding["code"] for finding in card["findings"]]


@pytest.mark.django_db
def test_engine_page_tells_the_unparsed_startup_lines_in_words(admin_client: Any,
                                                               node: Any) -> None:
    newest = releases()[-1]
    entry = next(e for e in newest["log_lines"] if e["item"] == "kv_available")
    message = entry["near_miss"]["message"]
    log = parse_startup_log(_records(newest, entry, message)["APIServer"])
    Engine.objects.create(node=node, name="v", container_id="e" * 64, container_state="running",
                          startup=log.as_dict())

    page = admin_client.get("/nodes/spark-a/engines/v/").content.decode()

    assert (f"vLLM printed 1 startup line SparkOps recognised but could not read: "
            f"“{message}” (the KV cache size left unknown).") in page


@pytest.mark.parametrize("data", _release_cases())
def test_whole_startup_of_a_release_reads_as_one(data: dict[str, Any]) -> None:
    """One line of each kind the release prints, in the order vLLM prints them (the order of
    the catalog): read as one startup that reached "ready", nothing unparsed."""
    first: dict[str, dict[str, Any]] = {}
    for entry in data["log_lines"]:
        if "error" not in entry["example"]:
            first.setdefault(entry["item"], entry)
    startup = list(first.values())
    text = "".join(
        _records(data, entry, entry["example"]["message"])["EngineCore_DP0"]
        for entry in startup
    )
    log = parse_startup_log(text)
    assert log.startup_count == 1
    assert log.unparsed == []
    assert log.errors == []
    assert log.version == data["version"]
    # 0.6 logs no "ready" line of its own (uvicorn's "Application startup complete" follows).
    assert log.phase == ("ready" if "ready" in first else "kv_allocated")


# --- metrics ----------------------------------------------------------------------------------

MODEL = "gemma-4"
READ_VALUES: dict[str, float] = {
    "requests_running": 3,
    "requests_waiting": 2,
    "prompt_tokens_total": 12345,
    "generation_tokens_total": 6789,
    "preemptions_total": 4,
    "prefix_cache_queries_total": 1000,
    "prefix_cache_hits_total": 250,
    "spec_decode_drafts_total": 50,
    "spec_decode_draft_tokens_total": 150,
    "spec_decode_accepted_tokens_total": 120,
}
# V0's speculative-decoding gauges (fractions since start).
READ_FRACTIONS = {"spec_decode_draft_acceptance_rate": 0.8, "spec_decode_efficiency": 0.6}
# Series told apart by one more label: each label value and the value it is set to. Asleep at
# level 1 (vLLM's record_sleep_state(1, 1)); accepted tokens at draft positions 0, 1 and 2.
BY_LABEL = {
    "sleep_state": {"awake": 0, "weights_offloaded": 1, "discard_all": 0},
    "position": {"0": 40, "1": 25, "2": 10},
}
# The current KV usage name and its pre-0.9 name get different values, so which one was read
# shows (vLLM PR #18354 renamed it; both are a fraction 0-1).
KV_USAGE = {"vllm:kv_cache_usage_perc": 0.25, "vllm:gpu_cache_usage_perc": 0.75}
CACHE_CONFIG = {
    "num_gpu_blocks": "26589",
    "block_size": "16",
    "kv_cache_size_tokens": "1230848",
    "kv_cache_max_concurrency": "9.39",
    "kv_cache_memory_bytes": "21474836480",
    "gpu_memory_utilization": "0.1",
    "cache_dtype": "fp8",
}
TTFT_OBSERVED = (0.05, 0.5, 0.5, 2.0)
ITL_OBSERVED = (0.02, 0.03, 0.03, 0.04, 0.2)


def _engine_sets(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The V0 engine's metrics (vllm/engine/metrics.py, up to 0.10) and the V1 engine's."""
    v0 = [m for m in data["metrics"] if m["file"] == "vllm/engine/metrics.py"]
    v1 = [m for m in data["metrics"] if m["file"] != "vllm/engine/metrics.py"]
    return {name: metrics for name, metrics in (("V0", v0), ("V1", v1)) if metrics}


def _labels(metric: dict[str, Any]) -> list[str]:
    labels = metric["labelnames"]
    if isinstance(labels, list):
        return labels
    # A label list passed in at run time: V0's stat logger gets labels=dict(model_name=…)
    # (vllm/engine/llm_engine.py, 0.6-0.10); the V1 connectors get the engine's two; the
    # extraction writes what is added to them (``labelnames + ['position']``).
    given = ["model_name"] if metric["file"] == "vllm/engine/metrics.py" \
        else ["model_name", "engine"]
    try:
        extra = ast.literal_eval(labels.partition(" + ")[2] or "[]")
    except (ValueError, SyntaxError):
        extra = []  # names, not literals (a class constant): a label not known here
    return given + [label for label in extra if label not in given]


def _label_values(labels: list[str]) -> dict[str, str]:
    values = {"model_name": MODEL, "engine": "0", "finished_reason": "stop"}
    return {label: CACHE_CONFIG.get(label, values.get(label, "None")) for label in labels}


def _render_exposition(metrics: list[dict[str, Any]], show_hidden: bool) -> str:
    """The release's definitions rendered by prometheus_client, as vLLM serves them."""
    registry = CollectorRegistry()
    made: set[str] = set()
    for metric in metrics:
        if metric.get("hidden") and not show_hidden:
            continue
        name = metric["name"]
        base = name.removesuffix("_total") if metric["type"] == "counter" else name
        if base in made or metric["type"] not in ("gauge", "counter", "histogram"):
            continue
        made.add(base)
        labels = _labels(metric)
        documentation = metric["documentation"] or name
        made_metric = _make(metric, name, documentation, labels, registry)
        by_label = next((label for label in labels if label in BY_LABEL), None)
        if by_label is not None:
            for value, amount in BY_LABEL[by_label].items():
                child = made_metric.labels(**{**_label_values(labels), by_label: value})
                child.set(amount) if metric["type"] == "gauge" else child.inc(amount)
            continue
        _set_value(metric, made_metric.labels(**_label_values(labels)) if labels else made_metric)
    return generate_latest(registry).decode()


def _make(metric: dict[str, Any], name: str, documentation: str, labels: list[str],
          registry: CollectorRegistry) -> Any:  # fmt: skip
    if metric["type"] == "gauge":
        return Gauge(name, documentation, labels, registry=registry)
    if metric["type"] == "counter":
        return Counter(name, documentation, labels, registry=registry)
    buckets = metric.get("buckets")
    if not isinstance(buckets, list) or not buckets:
        buckets = Histogram.DEFAULT_BUCKETS
    return Histogram(name, documentation, labels, buckets=buckets, registry=registry)


def _set_value(metric: dict[str, Any], child: Any) -> None:
    reads = metric.get("reads")
    if metric["name"] in KV_USAGE:
        child.set(KV_USAGE[metric["name"]])
    elif reads == "ttft":
        for value in TTFT_OBSERVED:
            child.observe(value)
    elif reads == "inter_token_latency":
        for value in ITL_OBSERVED:
            child.observe(value)
    elif reads in READ_FRACTIONS:
        child.set(READ_FRACTIONS[reads])
    elif reads in READ_VALUES:
        if metric["type"] == "gauge":
            child.set(READ_VALUES[reads])
        else:
            child.inc(READ_VALUES[reads])
    elif metric["type"] == "histogram":
        child.observe(1.0)
    elif metric["type"] == "counter":
        child.inc(1)
    else:
        child.set(1)


def _expected_snapshot(metrics: list[dict[str, Any]], show_hidden: bool) -> dict[str, Any]:
    shown = [m for m in metrics if show_hidden or not m.get("hidden")]
    names = {m["name"].removesuffix("_total") if m["type"] == "counter" else m["name"]
             for m in shown}  # fmt: skip
    expected: dict[str, Any] = {}
    for metric in shown:
        reads = metric.get("reads")
        if reads in READ_VALUES:
            expected[reads] = READ_VALUES[reads]
        elif reads in READ_FRACTIONS:
            expected[reads] = READ_FRACTIONS[reads]
    # Sleep mode's gauge (0.11-0.33) and the accepted tokens per draft position (0.8-0.33).
    sleeps = "vllm:engine_sleep_state" in names
    expected["asleep"], expected["sleep_level"] = (True, 1) if sleeps else (None, None)
    expected["spec_decode_accepted_per_position_total"] = (
        tuple(BY_LABEL["position"].values())
        if "vllm:spec_decode_num_accepted_tokens_per_pos" in names else None
    )
    if "vllm:kv_cache_usage_perc" in names:
        expected["kv_cache_usage"] = KV_USAGE["vllm:kv_cache_usage_perc"]
    elif "vllm:gpu_cache_usage_perc" in names:
        expected["kv_cache_usage"] = KV_USAGE["vllm:gpu_cache_usage_perc"]
    else:
        expected["kv_cache_usage"] = None
    expected["ttft_count"] = len(TTFT_OBSERVED) if "vllm:time_to_first_token_seconds" in names \
        else None
    itl = {"vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"} & names
    expected["inter_token_latency_count"] = len(ITL_OBSERVED) if itl else None
    return expected


def _metric_cases() -> list[Any]:
    return [
        pytest.param(data, engine, hidden, id=f"{data['version']}-{engine}"
                                              f"{'-hidden-shown' if hidden else ''}")
        for data in releases()
        for engine in _engine_sets(data)
        for hidden in (False, True)
        if not hidden or any(m.get("hidden") for m in _engine_sets(data)[engine])
    ]


@pytest.mark.parametrize(("data", "engine", "show_hidden"), _metric_cases())
def test_metrics_of_a_release_are_read(
    data: dict[str, Any], engine: str, show_hidden: bool
) -> None:
    metrics = _engine_sets(data)[engine]
    text = _render_exposition(metrics, show_hidden)
    snapshots = [s for s in parse_engines(text) if s.model_name == MODEL]
    assert len(snapshots) == 1
    snapshot = snapshots[0]
    expected = _expected_snapshot(metrics, show_hidden)
    running = next(m for m in metrics if m["name"] == "vllm:num_requests_running")
    assert snapshot.engine == ("0" if "engine" in _labels(running) else None)
    for name, value in expected.items():
        if name.endswith("_count"):
            histogram = getattr(snapshot, name.removesuffix("_count"))
            assert (histogram.count if histogram is not None else None) == value, name
        else:
            assert getattr(snapshot, name) == value, name
    _assert_capacity(snapshot, metrics)
    _assert_legacy_names(snapshot, metrics, show_hidden)


def _assert_capacity(snapshot: MetricsSnapshot, metrics: list[dict[str, Any]]) -> None:
    info = next((m for m in metrics if m["name"] == "vllm:cache_config_info"), None)
    if info is None or not isinstance(info["labelnames"], list):
        assert snapshot.num_gpu_blocks is None
        return
    labels = info["labelnames"]
    assert snapshot.num_gpu_blocks == 26589
    assert snapshot.block_size == (16 if "block_size" in labels else None)
    if "kv_cache_size_tokens" in labels:
        assert (snapshot.kv_cache_size_tokens, snapshot.kv_cache_size_source) == (
            1230848, "kv_cache_size_tokens"
        )
        assert snapshot.kv_cache_max_concurrency == 9.39
    else:
        assert (snapshot.kv_cache_size_tokens, snapshot.kv_cache_size_source) == (
            26589 * 16, "num_gpu_blocks*block_size"
        )
    if "kv_cache_memory_bytes" in labels:
        assert snapshot.kv_cache_memory_bytes == 21474836480
    assert snapshot.gpu_memory_utilization == 0.1
    assert snapshot.cache_dtype == "fp8"


def _assert_legacy_names(
    snapshot: MetricsSnapshot, metrics: list[dict[str, Any]], show_hidden: bool
) -> None:
    shown = {m["name"] for m in metrics if show_hidden or not m.get("hidden")}
    if "vllm:kv_cache_usage_perc" not in shown and "vllm:gpu_cache_usage_perc" in shown:
        assert "vllm:gpu_cache_usage_perc" in snapshot.legacy_names
    if "vllm:kv_cache_usage_perc" in shown:
        assert "vllm:gpu_cache_usage_perc" not in snapshot.legacy_names


def test_histogram_buckets_are_vllms_own() -> None:
    """The TTFT buckets SparkOps interpolates in are the release's (0.33: buckets.py)."""
    newest = releases()[-1]
    ttft = next(m for m in newest["metrics"] if m["name"] == "vllm:time_to_first_token_seconds")
    assert ttft["buckets"][:3] == [0.001, 0.005, 0.01] and ttft["buckets"][-1] == 2560.0
    text = _render_exposition(_engine_sets(newest)["V1"], show_hidden=False)
    snapshot = next(s for s in parse_engines(text) if s.model_name == MODEL)
    assert snapshot.ttft is not None
    assert [bound for bound, _ in snapshot.ttft.buckets] == [*ttft["buckets"], math.inf]


# --- flags ------------------------------------------------------------------------------------


def _flag_forms(flag: dict[str, Any]) -> list[list[str]]:
    name = f"--{flag['name']}"
    if flag["kind"] == "switch":
        return [[name]]
    if flag["kind"] == "negatable":
        return [[name], [f"--no-{flag['name']}"]]
    return [[name, "1"]]


@pytest.mark.parametrize("data", _release_cases())
def test_every_flag_is_known_or_harmlessly_kept(data: dict[str, Any]) -> None:
    """Each flag, before the model or after it, never swallows the model or the next flag."""
    for flag in data["flags"]:
        for form in _flag_forms(flag):
            orders = [["vllm", "serve", "org/m", *form, "--port", "8001"]]
            if flag["kind"] != "multi":  # nargs="+" takes the model too, in argparse as here
                orders.append(["vllm", "serve", *form, "org/m", "--port", "8001"])
            for argv in orders:
                config = parse_command_line(argv)
                where = f"{data['version']} {' '.join(form)}"
                assert (config.model, config.port) == ("org/m", 8001), where
                assert flag["name"] in config.all_flags, where
                if flag["name"] in _FLAGS:
                    assert flag["name"] not in config.unknown_flags, where


def test_flag_history_is_what_the_fixtures_say() -> None:
    """collectors/vllm/flag_history.py is generated from the fixtures and has not drifted."""
    history = extractor().flag_history(list(releases()))
    assert frozenset(history["switches"]) == flag_history.SWITCHES
    assert frozenset(history["all"]) == flag_history.ALL_FLAGS
    assert releases()[-1]["version"] == flag_history.NEWEST_RELEASE_READ
    assert history["removed"] == flag_history.REMOVED


def test_docs_table_is_what_the_fixtures_say() -> None:
    table = (REPO / "docs" / "VLLM_RELEASES.md").read_text(encoding="utf-8")
    assert table == extractor().docs_table(list(releases()))
    for data in releases():
        assert f"[{data['version']}](../tests/fixtures/vllm_releases/{data['version']}.json)" \
            in table


def _removed_cases() -> list[Any]:
    by_version = {data["version"]: data for data in releases()}
    return [
        pytest.param(name, facts, by_version, id=name)
        for name, facts in sorted(flag_history.REMOVED.items())
    ]


@pytest.mark.parametrize(("name", "facts", "by_version"), _removed_cases())
def test_removed_flag_is_judged_against_the_engines_own_version(
    name: str, facts: dict[str, Any], by_version: dict[str, dict[str, Any]]
) -> None:
    last, removed_in = by_version[facts["last"]], by_version[facts["removed_in"]]
    assert name in {f["name"] for f in last["flags"]} | {
        alias for f in last["flags"] for alias in f.get("aliases", [])
    }
    assert name not in {f["name"] for f in removed_in["flags"]}
    declared = next(f for f in last["flags"] if name in (f["name"], *f.get("aliases", [])))
    value = [] if declared["kind"] in ("switch", "negatable") else ["1"]
    config = parse_command_line(["vllm", "serve", "org/m", f"--{name}", *value])

    def removed(version: str | None) -> list[Any]:
        log = StartupLog(phase="ready", version=version) if version else None
        return [f for f in check_config(config, log=log) if f.code == "removed-flag"]

    for version in (removed_in["version"], releases()[-1]["version"]):
        found = removed(version)
        assert [f.severity for f in found] == ["error"], version
        assert f"--{name}" in found[0].message and version in found[0].message
    assert removed(last["version"]) == [], "an engine that still has the flag"
    unknown = removed(None)
    assert [f.severity for f in unknown] == ["warning"]
    assert "not known" in unknown[0].message
