"""Roll-up rows a chart has read and that can no longer change, kept for its next request.

A long-range chart (a day and more) groups tens of thousands of roll-up rows into its buckets at
every request, though all but the newest of those buckets were final long before: a roll-up
bucket is written once the node's roll-up watermark (``Node.rolled_up_until``) has passed it,
and never again (``collectors.retention``). The overview polls its chart every few seconds, so
nearly all of that grouping was done at the request before.

:class:`SettledRows` keeps, per chart source (a roll-up query of one node's or engine set's
series, at one tier and one bucket width), the rows of its *settled* buckets: whole buckets,
on the grid the database groups on (multiples of the width since the epoch), that end at or
before the tier's last complete bucket. A request then reads from the database only what is
new since the last one (the buckets settled since, in one small query) and, as before, the
part of its range outside whole settled buckets: the partial bucket at its start, the buckets
the watermark has not passed, the minute roll-ups and the raw samples after it
(``dashboard.series``). What it draws is what it drew without the cache, row for row.

An entry whose settled end moves backwards (a watermark set back, a database restored under a
running server) is read again whole, and rows older than a request's range are dropped from the
front. The store is per process, bounded by entries and rows (the least recently used entry
goes first), and safe across the web server's threads; a source is named by its owner's
identity (primary key with its creation time), so a row id reused by a new node or engine
never meets an old entry. Rows deleted by retention while still inside a range stay drawn
until the range has moved past them: they were true when read.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

MAX_ENTRIES = 32
# About 190 bytes a row: 10 MB at most. The timeline of a node with 4 engines keeps some 8,000
# rows (host, engines and GPUs) for each of its long ranges (a day, a week, 30 days).
MAX_ROWS = 50_000

Fetch = Callable[[int, int], list[tuple]]  # rows of buckets starting in [first ms, end ms)


@dataclass
class _Entry:
    first: int  # epoch ms: the start of the first bucket held
    end: int  # epoch ms: the end of the last bucket held
    epochs: list[int] = field(default_factory=list)  # each row's bucket, ascending
    rows: list[tuple] = field(default_factory=list)  # in the same order


class SettledRows:
    """Settled roll-up rows by chart source (module docstring)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_rows: int = MAX_ROWS) -> None:
        self.max_entries, self.max_rows = max_entries, max_rows
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._rows = 0
        self._lock = threading.Lock()

    def rows(self, key: Hashable, first: int, end: int, epoch_at: int, fetch: Fetch
             ) -> list[tuple]:
        """The rows of the settled buckets in [first, end) (epoch ms, both on the bucket grid),
        each with its bucket's start at index ``epoch_at``; ``fetch(a, b)`` reads those of
        [a, b) from the database, called only for what the entry does not hold yet."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or first < entry.first or end < entry.end or first >= entry.end:
            entry = _Entry(first, first)  # nothing of it to keep
        if end > entry.end:
            entry = _extended(entry, fetch(entry.end, end), end, epoch_at)
        if first > entry.first:
            entry = _trimmed(entry, first)
        self._keep(key, entry)
        return entry.rows

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._rows = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _keep(self, key: Hashable, entry: _Entry) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            self._rows -= len(old.rows) if old is not None else 0
            if len(entry.rows) > self.max_rows:
                return
            self._entries[key] = entry
            self._rows += len(entry.rows)
            while len(self._entries) > self.max_entries or self._rows > self.max_rows:
                _, evicted = self._entries.popitem(last=False)
                self._rows -= len(evicted.rows)


def _extended(entry: _Entry, new: list[tuple], end: int, epoch_at: int) -> _Entry:
    """``entry`` with the rows of [entry.end, end) added: a new entry, so that a request still
    reading the old one (another thread) is not disturbed."""
    new = sorted(new, key=lambda row: row[epoch_at])
    return _Entry(entry.first, end, entry.epochs + [row[epoch_at] for row in new],
                  entry.rows + new)


def _trimmed(entry: _Entry, first: int) -> _Entry:
    """``entry`` without the rows before ``first`` (which is inside it)."""
    cut = bisect_left(entry.epochs, first)
    return _Entry(first, entry.end, entry.epochs[cut:], entry.rows[cut:])


settled_rows = SettledRows()
