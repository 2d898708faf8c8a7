"""The compaction counters are read from /proc/vmstat by one regular expression: they are what
a reading of every ``name value`` line would give, on this machine's file and on odd ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.fragmentation import COMPACTION_COUNTERS, parse_compaction, read_compaction
from collectors.procfs import Procfs


def _every_line(text: str) -> dict[str, int]:
    """The counters as a reading of every line finds them (the last line of a name wins)."""
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[name] = int(value)
    return {name: values[name] for name in COMPACTION_COUNTERS if name in values}


def test_this_machines_vmstat_gives_what_every_line_gives():
    text = Path("/proc/vmstat").read_text()
    assert parse_compaction(text) == _every_line(text)
    assert set(parse_compaction(text)) == set(COMPACTION_COUNTERS)  # every kernel since 2.6.35


@pytest.mark.parametrize("text", [
    "",
    "nr_free_pages 12\ncompact_stall 3\ncompact_fail 1\ncompact_success 2\n",
    "compact_stall 3",  # no newline at the end
    "compact_stall 3\ncompact_stall 7\n",  # the last one wins
    "compact_stall x\ncompact_fail -1\ncompact_success 4 5\n",  # not counts: skipped
    "compact_stall  9 \n",  # spaces around the count
    "xcompact_stall 3\ncompact_stalls 4\ncompact_daemon_wake 8\n",  # other names
    "compact_stall\ncompact_fail 2\n",  # no value
    "compact_success 10\r\ncompact_fail 2\r\n",  # carriage returns
])
def test_odd_files_give_what_every_line_gives(text):
    assert parse_compaction(text) == _every_line(text)


def test_an_unreadable_vmstat_is_an_error_in_words(tmp_path):
    reading = read_compaction(Procfs(tmp_path))
    assert reading.values == {} and "vmstat" in reading.error
