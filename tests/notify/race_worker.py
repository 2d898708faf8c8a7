"""A child process for the multi-process claim test (``python -m tests.notify.race_worker``).

``seed <count>``: create one webhook channel and ``count`` due notifications.
``deliver <worker> <log> <start>``: wait until the Unix time ``start``, then deliver due rows in
small batches until none is left, through a transport that appends "<message_id> <worker>" to
``log`` instead of sending (an O_APPEND line write is atomic between processes).
"""

from __future__ import annotations

import os
import sys
import time

import django


class AppendingTransport:
    def __init__(self, path: str, worker: str) -> None:
        self.path = path
        self.worker = worker

    def send(self, notification: object, deadline: float | None = None) -> None:
        line = f"{notification.message_id} {self.worker}\n".encode()  # type: ignore[attr-defined]
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)
        time.sleep(0.002)  # long enough for the other workers to run into this row's claim


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sparkops.settings")
    django.setup()
    from dashboard.notify import outbox
    from dashboard.notify.models import Channel
    from dashboard.notify.transports import TRANSPORTS

    if argv[0] == "seed":
        # Several channels: each takes one send at a time, so workers race across channels
        # for the channel claims and, within one, for the same rows.
        channels = [Channel.objects.create(name=f"race-{n}", kind="webhook",
                                           config={"url": f"https://hooks.example/race{n}"})
                    for n in range(int(argv[2]))]
        for index in range(int(argv[1])):
            outbox.enqueue(kind="firing", payload={}, subject="s", text="t", html="",
                           channels=[channels[index % len(channels)]])
        return
    worker, log, start = argv[1], argv[2], float(argv[3])
    TRANSPORTS["webhook"] = AppendingTransport(log, worker)
    time.sleep(max(0.0, start - time.time()))
    while outbox.deliver_due(worker=worker, limit=5).found:
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
