"""Run the engine emulator as a real subprocess on loopback and observe it from outside.

Everything a test learns goes through the same seams SparkOps uses on a real node: the process's
stdout (the log), HTTP on 127.0.0.1, and /proc/<pid>/status for memory.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sparkops.testing.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20

# Short phases keep a start-up around a second; the real one takes ~10 minutes.
FAST_PHASES = (
    "--emulator-load-seconds",
    "0.4",
    "--emulator-profile-seconds",
    "0.2",
    "--emulator-graph-seconds",
    "0.2",
)



class Emulator:
    """One `python -m collectors.emulator` process, its log lines collected as they arrive."""

    def __init__(self, *args: str, model: str = "org/test-model", serve: bool = True) -> None:
        self.port = free_port()
        head = ["serve", model] if serve else ["--model", model]
        self.command = [
            sys.executable,
            "-m",
            "collectors.emulator",
            *head,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *args,
        ]
        self.proc = subprocess.Popen(
            self.command,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    # --- log -----------------------------------------------------------------------------------

    def wait_for_line(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        """The first log line matching `pattern` (re.search), waiting for it if needed."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    match = regex.search(line)
                    if match:
                        return match
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"no line matching {pattern!r}; log:\n" + "\n".join(self.lines[-40:])
                    )
                self._changed.wait(min(remaining, 0.2))

    def log_text(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    # --- HTTP ----------------------------------------------------------------------------------

    def request(
        self, path: str, body: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            headers={"Content-Type": "application/json"} if data else {},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def get_json(self, path: str) -> Any:
        status, body = self.request(path)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def metrics_text(self) -> str:
        status, body = self.request("/metrics")
        assert status == 200
        return body.decode()

    def health_statuses_until_ready(self, timeout: float = 15.0) -> list[int]:
        """Poll /health until 200; return every status seen (connection refused is skipped)."""
        seen: list[int] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status, _ = self.request("/health", timeout=2.0)
            except (urllib.error.URLError, ConnectionError):
                status = 0
            if status:
                seen.append(status)
            if status == 200:
                return seen
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"not ready: statuses {seen}; log:\n{self.log_text()}")

    def wait_ready(self, timeout: float = 15.0) -> None:
        self.health_statuses_until_ready(timeout)

    # --- process -------------------------------------------------------------------------------

    def rss_bytes(self) -> int:
        """VmRSS of the emulator process, from /proc/<pid>/status."""
        text = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB$", text, re.MULTILINE)
        assert match, text
        return int(match.group(1)) * 1024

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._reader.join(timeout)

    def wait_exit(self, timeout: float = 15.0) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        return code

    def close(self) -> None:
        """Stop the process whatever state it is in (test clean-up)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def metric_value(families: dict[str, Any], name: str, **labels: str) -> float:
    """The value of sample `name` whose labels include `labels`, from parsed families."""
    for family in families.values():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(f"{name} {labels}")
