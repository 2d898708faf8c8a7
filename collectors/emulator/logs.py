"""The log writer: vLLM's line prefixes, one flushed line at a time.

A vLLM line is `(<Proc> pid=N) LEVEL MM-DD HH:MM:SS [file.py:LINE] message`. vLLM
prefixes *everything* a process writes to stdout, so uvicorn's own lines come out as
`(APIServer pid=N) INFO:     Application startup complete.`.

One OS process plays both vLLM processes here. The EngineCore prefix carries this process's pid on
purpose: in real vLLM the EngineCore process is the one holding GPU memory, and here this process
is the one holding the memory, so a collector that joins log pids to per-process memory stays
right.
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

from .styles import Style

API_PROCESS = "APIServer"


class VllmLog:
    """Writes vLLM-format lines to `stream`; thread-safe, flushes after every line.

    A closed or broken stream (the reader went away) is ignored: losing the log must not take the
    engine down.
    """

    def __init__(self, style: Style, stream: TextIO, pid: int,
                 core_process: str | None = None) -> None:
        self.style = style
        self.pid = pid
        # Whose lines `core` writes: the engine core's, or (a headless rank) its worker's.
        self.core_process = core_process or style.engine_process
        self._stream = stream
        self._lock = threading.Lock()

    def _write(self, line: str) -> None:
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (OSError, ValueError):
                pass

    def _line(self, process: str, level: str, source: str, message: str) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime())
        self._write(f"({process} pid={self.pid}) {level} {stamp} [{source}] {message}")

    def api(self, source: str, message: str, level: str = "INFO") -> None:
        """A line from the API server process (frontend, stats logger, HTTP launcher)."""
        self._line(API_PROCESS, level, source, message)

    def core(self, source: str, message: str, level: str = "INFO") -> None:
        """A line from the engine core process (model runner, worker, KV planning)."""
        self._line(self.core_process, level, source, message)

    def main(self, source: str, message: str, level: str = "INFO") -> None:
        """A line from a process vLLM never named: the logging module's ``MainProcess``
        (vllm/logger.py:48 of 0.33.0), as a headless rank's launcher writes them."""
        self._line("MainProcess", level, source, message)

    def uvicorn(self, message: str, level: str = "INFO") -> None:
        """uvicorn's format: level, colon, padded to column 10 (`INFO:     …`)."""
        self._write(f"({API_PROCESS} pid={self.pid}) {(level + ':').ljust(9)} {message}")

    def plain(self, process: str, text: str) -> None:
        """A line with only the process prefix, as a traceback printed by multiprocessing."""
        self._write(f"({process} pid={self.pid}) {text}")

    def engine_error(self, source: str, message: str) -> None:
        """An ERROR line from the engine core (used for failure tracebacks)."""
        self.core(source, message, level="ERROR")
