"""What the figures were measured on: hardware, kernel and every version that matters."""

from __future__ import annotations

import os
import platform
import sqlite3
import subprocess
from importlib import metadata
from pathlib import Path

from bench import promstack
from bench.services import PROJECT
from sparkops.testing.postgres import postgres_version


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024**2
    return 0.0


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()


def _command_version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0] if lines else "unknown"


def _package(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe() -> dict:
    """The machine and versions, as plain strings."""
    commit = _command_version(["git", "-C", str(PROJECT), "rev-parse", "--short", "HEAD"])
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": round(_mem_total_gib(), 1),
        "kernel": platform.release(),
        "os": _os_name(),
        "python": platform.python_version(),
        "django": _package("Django"),
        "celery": _package("celery"),
        "kombu": _package("kombu"),
        "gunicorn": _package("gunicorn"),
        "psycopg": _package("psycopg"),
        "sqlite": sqlite3.sqlite_version,
        "postgresql": postgres_version(),
        "podman": _command_version(["podman", "--version"]),
        **{name: version for name, version in promstack.versions().items()},
        "commit": commit,
    }
