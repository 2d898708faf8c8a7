"""Charts are built with the cyclic garbage collector paused (``dashboard.heap``)."""

from __future__ import annotations

import gc
import threading

import pytest

from dashboard.heap import collector_paused


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_collector_is_paused_inside_and_resumed_after(collector_on):
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_it_resumes_after_an_error_too(collector_on):
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the chart failed")
    assert gc.isenabled()


def test_overlapping_sections_resume_only_when_the_last_one_ends(collector_on):
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def second() -> None:
        first_in.wait()
        with collector_paused():
            second_in.set()
            first_out.wait()
            seen["after the first ended"] = gc.isenabled()

    thread = threading.Thread(target=second)
    thread.start()
    with collector_paused():
        first_in.set()
        second_in.wait()
    first_out.set()
    thread.join()

    assert seen == {"after the first ended": False}
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(collector_on):
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()
