"""kombu's file-system transport, made safe for a worker that publishes from its own threads.

kombu's ``filesystem://`` transport writes a message by creating its file, locking it, then
writing; its reader moves and reads any file of the queue without looking at the lock. A reader
that comes between the creation and the write reads an empty message, and the Celery worker
dies of it (``JSONDecodeError``: celery/kombu#1551). Between processes that window is a few
microseconds; with beat and the tasks publishing from threads of the very worker that reads, it
is a thread switch wide, and the stack's worker died within a minute.

This transport, which the settings select whenever the broker is the file system, closes both
sides:

* it writes a message under a temporary name that no queue matches (``.<name>.tmp``) and
  renames it into place, so a message file exists only once it is complete;
* it reads a message only when no one holds the file locked (a writer of the plain transport,
  in another process such as the web server, locks it for its write) and the file is not empty
  (a plain writer between creating and locking it). Such a file is skipped and read at the next
  poll; an empty one left that way for a minute (its writer died) is removed.

Between two looks at its queues, kombu's reader sleeps its ``polling_interval``. Here that wait
ends as soon as a thread of the same process writes a message (``Transport.drain_events``): in
the one process, beat, the tasks' follow-ups and the web server all publish from the worker's
own process, so their messages are taken at once, and the interval (kombu's 1 s, see the
settings) only bounds how late a message of another process (a management command, the web
server of the processes layout) is seen.

Files, folders and options are those of kombu's transport; processes using either one share the
queues. Message files are created with mode 0600 (the settings create the folders 0700): the
data directory they live in is private to the user SparkOps runs as.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
import uuid
from queue import Empty

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

__all__ = ["Channel", "Transport"]

# An empty message file older than this was abandoned by its writer.
ABANDONED_SECONDS = 60.0
# Set whenever a thread of this process has written a message (module docstring).
_written = threading.Event()


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: dict, **kwargs: object) -> None:
        name = f"{int(round(time.monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        temporary = os.path.join(self.data_folder_out, f".{name}.tmp")
        try:
            # Mode 0600 from its creation, whatever the umask: a message carries task arguments.
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(descriptor, "wb", buffering=0) as file:
                file.write(str_to_bytes(dumps(payload)))
            os.replace(temporary, final)
            _written.set()
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.remove(temporary)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: str) -> dict:
        wanted = f"{queue}.msg"
        for filename in sorted(os.listdir(self.data_folder_in)):
            if filename.startswith(".") or filename.partition(".")[2] != wanted:
                continue
            payload = self._take(filename)
            if payload is not None:
                return loads(bytes_to_str(payload))
        raise Empty()

    def _take(self, filename: str) -> bytes | None:
        """The file's message, once it is complete and this reader claimed it; else None."""
        path = os.path.join(self.data_folder_in, filename)
        try:
            file = open(path, "rb")  # noqa: SIM115 - closed below, after the claim
        except OSError:
            return None  # taken by another reader meanwhile
        with file:
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return None  # a writer (or another reader) holds it
            try:
                payload = file.read()
                if not payload:
                    if time.time() - os.fstat(file.fileno()).st_mtime > ABANDONED_SECONDS:
                        self._claim(path, filename)
                    return None
                return payload if self._claim(path, filename) else None
            except OSError as exc:
                raise ChannelError(f"Cannot read file {path!r} from queue.") from exc

    def _claim(self, path: str, filename: str) -> bool:
        """Take the file out of the queue; False when another reader took it first."""
        try:
            if self.store_processed:
                os.replace(path, os.path.join(self.processed_folder, filename))
            else:
                os.remove(path)
        except FileNotFoundError:
            return False
        return True


class Transport(filesystem.Transport):
    Channel = Channel

    def drain_events(self, connection: object, timeout: float | None = None) -> None:
        """kombu's loop (``virtual.Transport.drain_events``), whose wait between two looks at
        the queues ends when a thread of this process writes a message. The flag is cleared
        before each look, so a message written during a look is either found by it or ends
        the wait after it. (With several readers in one process, which a worker is not, one
        may clear the flag another would have waited on: that one sees the message at its next
        look, as without the flag.)"""
        started = time.monotonic()
        polling_interval = self.polling_interval
        if timeout and polling_interval and polling_interval > timeout:
            polling_interval = timeout
        while True:
            _written.clear()
            try:
                self.cycle.get(self._deliver, timeout=timeout)
            except Empty:
                if timeout is not None and time.monotonic() - started >= timeout:
                    raise TimeoutError() from None  # socket.timeout, which Celery catches
                if polling_interval is not None:
                    _written.wait(polling_interval)
            else:
                return
