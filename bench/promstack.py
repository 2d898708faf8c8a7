"""The stack an admin would otherwise run: Prometheus, node_exporter and Alertmanager.

Debian's packaged binaries, each started directly with a configuration of our own (nothing under
/etc is used or changed), on loopback ports, with storage in the benchmark's work directory.

The rules are the SparkOps rules written in PromQL:

* ``HeadroomBelowPrefillNeed`` — ``node_memory_MemAvailable_bytes`` below the prefill need plus
  the margin, ``for`` the same 10 s as SparkOps' ``prefill-squeeze``;
* ``QueueBacklog`` — ``vllm:num_requests_waiting > 0`` for 15 s;
* ``EngineDown`` — an engine's scrape failing for 60 s (SparkOps' ``engine-down``).

Each alert-latency trial rewrites the rules with its threshold and a ``trial`` label and reloads
Prometheus (SIGHUP): with ``group_by: [alertname, stack, trial]`` every trial is a new
Alertmanager group, as the first alert of its kind is. (A re-fired alert in an existing group
waits for ``group_interval``, 5 min by default, instead of ``group_wait``.)
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench.services import Child, http_ok
from sparkops.testing.ports import free_port, wait_for

PROMETHEUS = "prometheus"
NODE_EXPORTER = "prometheus-node-exporter"
ALERTMANAGER = "prometheus-alertmanager"
DEBIAN_PACKAGES = ("prometheus", "prometheus-node-exporter", "prometheus-alertmanager")
HEADROOM_ALERT = "HeadroomBelowPrefillNeed"


def versions() -> dict[str, str]:
    """First line of each binary's ``--version`` (e.g. "prometheus, version 2.42.0+ds ...")."""
    found = {}
    for binary in (PROMETHEUS, NODE_EXPORTER, ALERTMANAGER):
        try:
            out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                 timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            found[binary] = "not installed"
            continue
        text = (out.stdout or out.stderr).strip().splitlines()
        found[binary] = text[0] if text else "unknown"
    return found


def rules_yaml(group: str, threshold_bytes: int, trial: int, for_seconds: int) -> str:
    """The comparable rules; JSON is valid YAML, so no YAML library is needed."""
    rules = {"groups": [{"name": group, "rules": [
        {"alert": HEADROOM_ALERT,
         "expr": f'node_memory_MemAvailable_bytes{{job="node"}} < {threshold_bytes}',
         "for": f"{for_seconds}s", "labels": {"trial": str(trial), "severity": "critical"}},
        {"alert": "QueueBacklog", "expr": 'vllm:num_requests_waiting{job="vllm"} > 0',
         "for": "15s"},
        {"alert": "EngineDown", "expr": 'up{job="vllm"} == 0', "for": "60s"},
    ]}]}
    return json.dumps(rules, indent=1)


@dataclass
class Prometheus:
    """One Prometheus server. ``interval`` None means the documented defaults (scrape and
    evaluation every 1 m, scrape timeout 10 s); otherwise both run at ``interval`` seconds with
    a scrape timeout of 4 s (SparkOps' scrape deadline)."""

    name: str
    workdir: Path
    interval: float | None
    alertmanager_port: int
    engine_targets: list[str]
    node_exporter_port: int
    for_seconds: int = 10
    port: int = 0
    child: Child | None = None

    @property
    def rules_path(self) -> Path:
        return self.workdir / f"{self.name}-rules.yml"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict:
        global_config: dict = {"external_labels": {"stack": self.name}}
        if self.interval is not None:
            global_config.update(scrape_interval=f"{self.interval:g}s",
                                 evaluation_interval=f"{self.interval:g}s", scrape_timeout="4s")
        return {
            "global": global_config,
            "alerting": {"alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{self.alertmanager_port}"]}]}]},
            "rule_files": [str(self.rules_path)],
            "scrape_configs": [
                {"job_name": "vllm", "static_configs": [{"targets": self.engine_targets}]},
                {"job_name": "node", "static_configs": [
                    {"targets": [f"127.0.0.1:{self.node_exporter_port}"]}]},
            ],
        }

    def write_rules(self, threshold_bytes: int, trial: int) -> None:
        # Each server has its own group name: Prometheus derives a group's evaluation phase
        # from it, so independent servers evaluate at independent moments.
        self.rules_path.write_text(rules_yaml(f"sparkops-comparable-{self.name}",
                                              threshold_bytes, trial, self.for_seconds))

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config_path = self.workdir / f"{self.name}.yml"
        config_path.write_text(json.dumps(self.config(), indent=1))
        if not self.rules_path.exists():
            self.write_rules(threshold_bytes=0, trial=0)
        self.child = Child(self.name, [
            PROMETHEUS, f"--config.file={config_path}",
            f"--storage.tsdb.path={self.workdir / (self.name + '-data')}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ], log=self.workdir / f"{self.name}.log")

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(lambda: http_ok(f"{self.url}/-/ready"), timeout, f"{self.name} ready", 0.2)

    def reload(self, trial: int, timeout: float = 20) -> None:
        """SIGHUP, then wait until the rules of ``trial`` are the ones loaded."""
        assert self.child is not None
        self.child.signal(signal.SIGHUP)
        wait_for(lambda: self.loaded_trial() == trial, timeout, f"{self.name} rules reloaded",
                 0.1)

    def loaded_trial(self) -> int | None:
        data = self._api("rules")
        for group in (data or {}).get("groups", []):
            for rule in group.get("rules", []):
                if rule.get("name") == HEADROOM_ALERT:
                    return int(rule.get("labels", {}).get("trial", -1))
        return None

    def latest_sample_time(self) -> float | None:
        """When the newest ``node_memory_MemAvailable_bytes`` sample was scraped (Unix s)."""
        data = self._api("query", query='timestamp(node_memory_MemAvailable_bytes{job="node"})')
        results = (data or {}).get("result") or []
        return float(results[0]["value"][1]) if results else None

    def _api(self, endpoint: str, **params: str) -> dict | None:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{endpoint}{query}",  # noqa: S310
                                        timeout=5) as response:
                return json.loads(response.read()).get("data")
        except (OSError, ValueError):
            return None


@dataclass
class Alertmanager:
    """Alertmanager with its documented default timings (group_wait 30 s, group_interval 5 m,
    repeat_interval 4 h), posting every group to ``webhook_url``; clustering off."""

    name: str
    workdir: Path
    webhook_url: str
    port: int = 0
    child: Child | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = {
            "route": {"receiver": "bench", "group_by": ["alertname", "stack", "trial"]},
            "receivers": [{"name": "bench", "webhook_configs": [
                {"url": self.webhook_url, "send_resolved": True}]}],
        }
        config_path = self.workdir / f"{self.name}.yml"
        config_path.write_text(json.dumps(config, indent=1))
        self.child = Child(self.name, [
            ALERTMANAGER, f"--config.file={config_path}",
            f"--storage.path={self.workdir / (self.name + '-data')}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=",
        ], log=self.workdir / f"{self.name}.log")

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(lambda: http_ok(f"http://127.0.0.1:{self.port}/-/ready"), timeout,
                 f"{self.name} ready", 0.2)


@dataclass
class NodeExporter:
    """node_exporter with its default collectors; ``procfs`` replaces /proc (``--path.procfs``)."""

    workdir: Path
    procfs: Path | None = None
    port: int = 0
    child: Child | None = None

    def start(self) -> None:
        self.port = free_port()
        argv = [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{self.port}"]
        if self.procfs is not None:
            argv.append(f"--path.procfs={self.procfs}")
        self.child = Child("node_exporter", argv, log=self.workdir / "node_exporter.log")

    def wait_ready(self, timeout: float = 30) -> None:
        wait_for(lambda: http_ok(f"http://127.0.0.1:{self.port}/metrics"), timeout,
                 "node_exporter ready", 0.2)
