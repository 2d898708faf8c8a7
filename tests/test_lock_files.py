"""The hashed lock files against requirements.txt, each other, the venv and the GB10.

requirements.txt keeps the ranges; requirements.lock (its lines above "--- tests ---") and
requirements-test.lock (all of it) pin one version of each package with the sha256 of its files,
and bin/sparkops installs only from them (``pip install --require-hashes``). These checks read
the files and this venv, offline: a lock that falls behind requirements.txt, pins outside a
range, disagrees with the other lock, lost its hashes or its aarch64 wheels, or a venv that was
not installed from the test lock, fails here. The last test runs bin/sparkops' install step with
a stand-in Python to see which lock it installs and when it installs nothing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from tests.conftest import PROJECT

REQUIREMENTS = PROJECT / "requirements.txt"
RUNTIME_LOCK = PROJECT / "requirements.lock"
TEST_LOCK = PROJECT / "requirements-test.lock"
TESTS_SECTION = "# --- tests ---"
# The pins with compiled code that SparkOps runs on; their aarch64 wheels must be in both locks.
COMPILED_RUNTIME_PINS = ("psycopg-binary", "psutil")
PYTHONS = ((3, 11), (3, 12))
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})$")
_LISTED_WHEEL = re.compile(r"^#   (\S+\.whl) sha256:([0-9a-f]{64})$")


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    marker: str | None
    hashes: frozenset[str]


def _requirements() -> tuple[list[Requirement], list[Requirement]]:
    """requirements.txt's requirements: those above the tests section, and those in it."""
    runtime: list[Requirement] = []
    tests: list[Requirement] = []
    section = runtime
    for line in REQUIREMENTS.read_text().splitlines():
        if line.strip() == TESTS_SECTION:
            section = tests
        text = line.split(" #", 1)[0].strip()
        if text and not text.startswith("#"):
            section.append(Requirement(text))
    assert section is tests, f"requirements.txt has no {TESTS_SECTION!r} line"
    return runtime, tests


def _pins(lock: Path) -> list[Pin]:
    """Every requirement line of a lock (with its continuation lines), as written."""
    pins, logical = [], ""
    for line in lock.read_text().splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        logical += line.rstrip("\\").strip() + " "
        if line.endswith("\\"):
            continue
        words = logical.split()
        hashes = [word for word in words if word.startswith("--hash=")]
        requirement = Requirement(" ".join(word for word in words if word not in hashes))
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", logical
        pins.append(Pin(canonicalize_name(requirement.name), specifiers[0].version,
                        str(requirement.marker) if requirement.marker else None,
                        frozenset(match.group(1) for word in hashes
                                  if (match := _HASH.match(word)))))
        assert len(pins[-1].hashes) == len(hashes), f"a hash that is not sha256: {logical}"
        logical = ""
    assert not logical, f"{lock.name} ends inside a requirement"
    return pins


def _by_name(lock: Path) -> dict[str, Pin]:
    return {pin.name: pin for pin in _pins(lock)}


def _header(lock: Path) -> list[str]:
    lines = []
    for line in lock.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def _aarch64_platforms() -> list[str]:
    return [f"manylinux_2_{minor}_aarch64" for minor in range(28, 16, -1)] + [
        "manylinux2014_aarch64"]


def _wheel_fits(tags: frozenset[Tag], python: tuple[int, int]) -> bool:
    """Does a wheel with these tags install on CPython ``python``, Linux aarch64, glibc 2.28?"""
    platforms = _aarch64_platforms()
    interpreter = f"cp{python[0]}{python[1]}"
    supported = {*cpython_tags(python, platforms=platforms),
                 *compatible_tags(python, interpreter, platforms=platforms)}
    return bool(tags & supported)


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, TEST_LOCK], ids=lambda path: path.name)
def test_every_pin_is_exact_hashed_and_single(lock):
    pins = _pins(lock)

    assert pins, f"{lock.name} pins nothing"
    assert all(pin.hashes for pin in pins), [pin.name for pin in pins if not pin.hashes]
    names = [pin.name for pin in pins]
    # One version per package for every Python: no fork by Python version or platform.
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, TEST_LOCK], ids=lambda path: path.name)
def test_django_stays_on_a_release_for_python_3_11(lock):
    """Django 6 needs Python 3.12; one lock serves 3.11 (Debian bookworm) too."""
    assert Version(_by_name(lock)["django"].version) < Version("6")


def test_every_requirement_is_pinned_in_its_lock_within_its_range():
    runtime, tests = _requirements()
    locks = {RUNTIME_LOCK: runtime, TEST_LOCK: runtime + tests}
    for lock, requirements in locks.items():
        pins = _by_name(lock)
        for requirement in requirements:
            name = canonicalize_name(requirement.name)
            assert name in pins, f"{requirement} is not in {lock.name}: run bin/sparkops lock"
            assert requirement.specifier.contains(pins[name].version, prereleases=True), (
                f"{lock.name} pins {name}=={pins[name].version}, outside {requirement}")
            # An extra's own requirements (psycopg[binary] needs psycopg-binary) are pinned too.
            for extra in requirement.extras:
                for needed in importlib.metadata.requires(requirement.name) or []:
                    wanted = Requirement(needed)
                    if wanted.marker and wanted.marker.evaluate({"extra": extra}):
                        assert canonicalize_name(wanted.name) in pins, (lock.name, needed)


def test_the_runtime_lock_holds_no_test_package():
    _, tests = _requirements()
    runtime_pins = _by_name(RUNTIME_LOCK)

    assert not {canonicalize_name(r.name) for r in tests} & set(runtime_pins)


def test_both_locks_agree_on_every_shared_pin():
    runtime_pins, test_pins = _by_name(RUNTIME_LOCK), _by_name(TEST_LOCK)

    assert set(runtime_pins) <= set(test_pins), set(runtime_pins) - set(test_pins)
    assert {name: runtime_pins[name] for name in runtime_pins} == {
        name: test_pins[name] for name in runtime_pins}


def test_this_venv_has_exactly_the_test_locks_versions():
    """bin/sparkops test installs the test lock before running pytest: what runs the tests is
    what CI and every developer run."""
    wrong = {}
    for pin in _pins(TEST_LOCK):
        if pin.marker and not Marker(pin.marker).evaluate():
            continue
        try:
            installed = importlib.metadata.version(pin.name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != pin.version:
            wrong[pin.name] = (pin.version, installed)

    assert wrong == {}, f"locked vs installed: {wrong}; run bin/sparkops test to install"


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, TEST_LOCK], ids=lambda path: path.name)
def test_the_header_says_how_the_lock_was_made_and_checked(lock):
    header = "\n".join(_header(lock))

    assert "`bin/sparkops lock`" in header
    assert "--universal --generate-hashes --python-version 3.11" in header
    assert "CPython 3.11 and 3.12, Linux x86_64 and aarch64" in header
    assert f"pip install --require-hashes -r {lock.name}" in header


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, TEST_LOCK], ids=lambda path: path.name)
def test_the_lock_holds_the_aarch64_wheels_for_python_3_11_and_3_12(lock):
    """The header names the Linux aarch64 wheels that uv found for each pin built per platform
    when the lock was made; each must be a file whose hash the pin lists, and psycopg-binary and
    psutil need one for each Python, or pip would refuse to install them on a GB10."""
    pins = _by_name(lock)
    listed = [match.groups() for line in _header(lock) if (match := _LISTED_WHEEL.match(line))]
    assert listed, f"{lock.name} names no aarch64 wheel"
    fitting: dict[str, set[tuple[int, int]]] = {}
    for filename, sha256 in listed:
        name, version, _, tags = parse_wheel_filename(filename)
        assert name in pins and Version(pins[name].version) == version, filename
        assert sha256 in pins[name].hashes, f"{filename}: its hash is not among the pin's"
        assert all("aarch64" in tag.platform for tag in tags), filename
        fitting.setdefault(name, set()).update(
            python for python in PYTHONS if _wheel_fits(tags, python))
    for name in COMPILED_RUNTIME_PINS:
        assert fitting.get(name) == set(PYTHONS), (name, fitting.get(name))


# --- bin/sparkops' install step, with a stand-in Python ------------------------------------------

FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../calls"
"""


def _fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return venv


def _run(venv: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """bin/sparkops ARGS with the fake venv; the stand-in Python's calls, one per line."""
    calls = venv / "calls"
    calls.unlink(missing_ok=True)
    inherited = {k: v for k, v in os.environ.items() if k != "SPARKOPS_TEST_WORKERS"}
    env = {**inherited, "SPARKOPS_VENV": str(venv), **(env or {})}
    subprocess.run([str(PROJECT / "bin" / "sparkops"), *args], env=env, check=True,
                   capture_output=True, timeout=60)
    return calls.read_text().splitlines() if calls.exists() else []


def _stamp_line(lock: Path) -> str:
    return f"{hashlib.sha256(lock.read_bytes()).hexdigest()}  {lock.name}"


@pytest.mark.slow
def test_bin_sparkops_installs_each_lock_with_hashes_once(tmp_path):
    venv = _fake_venv(tmp_path)
    stamp = venv / ".requirements.sha256"
    stamp.write_text("0" * 64 + "\n")  # what an older SparkOps wrote: a hash of requirements.txt

    first = _run(venv, "start")
    assert first[0] == "-m pip install --quiet --require-hashes -r requirements.lock"
    assert first[-1] == "manage.py runstack"
    assert stamp.read_text().splitlines() == [_stamp_line(RUNTIME_LOCK)]

    assert not any("pip" in call for call in _run(venv, "start"))  # installed: nothing to do

    # Side by side by default: one worker more than the CPUs (2 to 4), then the tests that must
    # run by themselves.
    workers = min(max(os.sysconf("SC_NPROCESSORS_ONLN") + 1, 2), 4)
    tested = _run(venv, "test", "-q")
    assert tested == ["-m pip install --quiet --require-hashes -r requirements-test.lock",
                      f"-m pytest -n {workers} --dist loadfile --alone=skip -q",
                      "-m pytest -p no:xdist --alone=only -q"]
    assert _run(venv, "test", "-q", env={"SPARKOPS_TEST_WORKERS": "3"}) == [
        "-m pytest -n 3 --dist loadfile --alone=skip -q", "-m pytest -p no:xdist --alone=only -q"]
    # In one process when asked.
    assert _run(venv, "test", "-q", env={"SPARKOPS_TEST_WORKERS": "0"}) == ["-m pytest -q"]
    assert stamp.read_text().splitlines() == [_stamp_line(RUNTIME_LOCK), _stamp_line(TEST_LOCK)]
    # The test lock holds the runtime lock's pins: neither needs installing again.
    assert not any("pip" in call for call in _run(venv, "test", "-q") + _run(venv, "start"))
