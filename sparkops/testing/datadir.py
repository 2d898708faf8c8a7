"""A pytest plugin: every test process gets a data directory of its own.

The data directory holds what one SparkOps keeps beside its database: the notification
delivery's lock, the flight recorder, the kernel log's position, the broker's folders, the secret
key. A test process that used the checkout's ``var/`` would share all of that with a SparkOps
started from the same checkout, and test processes running side by side (pytest-xdist workers)
would share it with each other: one worker's delivery run holding the lock makes another's
return at once. So the plugin points ``SPARKOPS_DATA_DIR`` at a fresh temporary folder before
Django reads its settings, and removes the folder when the process ends. Processes the tests
start inherit it unless a test gives them their own.

Loaded with ``-p sparkops.testing.datadir`` (``pyproject.toml``'s ``addopts``): such a plugin is
imported before pytest-django loads the settings, which no conftest is.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ENV = "SPARKOPS_DATA_DIR"


def _own_data_dir() -> Path:
    # Each process its own: an xdist worker inherits the controller's environment, so an
    # existing value is replaced, not kept.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = Path(tempfile.mkdtemp(prefix=f"sparkops-test-data-{worker}-"))
    os.environ[ENV] = str(path)
    return path


DATA_DIR = _own_data_dir()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(DATA_DIR, ignore_errors=True)
