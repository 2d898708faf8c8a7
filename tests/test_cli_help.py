"""`bin/sparkops --help` lists every command the script dispatches, and nothing it does not."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import PROJECT

SCRIPT = PROJECT / "bin" / "sparkops"
pytestmark = pytest.mark.slow  # runs the script


def dispatched_commands() -> set[str]:
    """The commands of the script's top-level ``case`` (its labels, split at ``|``)."""
    text = SCRIPT.read_text()
    body = text[text.index('case "${1:-}" in'):]
    labels = re.findall(r"^  ([a-z|-]+)\)$", body, flags=re.MULTILINE)
    return {word for label in labels for word in label.split("|")} - {"-h", "--help", "help"}


def listed_commands(usage: str) -> set[str]:
    return set(re.findall(r"^  ([a-z]+) {2,}", usage, flags=re.MULTILINE))


def test_help_lists_every_command():
    result = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    commands = dispatched_commands()
    assert {"start", "demo", "test", "install", "uninstall", "status", "backup",
            "restore"} <= commands
    assert listed_commands(result.stdout) == commands


def test_an_unknown_command_prints_the_usage_and_fails():
    result = subprocess.run([str(SCRIPT), "strat"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "usage: bin/sparkops COMMAND" in result.stderr
    assert "start" in listed_commands(result.stderr)
