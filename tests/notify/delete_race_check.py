"""Run on PostgreSQL by ``test_channel_delete_postgres.py`` (``python -m
tests.notify.delete_race_check``): a notice queued for a channel while an admin deletes it.

The deletion takes the channel's lock and deletes it; a second thread queues a notice for that
channel meanwhile and must wait for the deletion, then queue nothing, without an error. Prints
one JSON line: ``{"rows": n}`` or ``{"error": "..."}``, and ``waited``.
"""

from __future__ import annotations

import json
import threading

import django


def main() -> None:
    django.setup()
    from django.db import connection, connections, transaction

    from dashboard.notify import outbox
    from dashboard.notify.models import Channel, Notification

    channel = Channel.objects.create(name="pager", kind=Channel.Kind.WEBHOOK,
                                     config={"url": "http://127.0.0.1:9/hook"})
    deleted = threading.Event()
    result: dict[str, object] = {}

    def queue_a_notice() -> None:
        deleted.wait(30)
        try:
            rows = outbox.enqueue(kind=Notification.Kind.TEST, payload={}, subject="s", text="t",
                                  html="", channels=[channel])
            result["rows"] = len(rows)
        except Exception as error:  # the outcome under test
            result["error"] = f"{type(error).__name__}: {error}"
        finally:
            connections.close_all()

    queuer = threading.Thread(target=queue_a_notice)
    queuer.start()
    with transaction.atomic():
        Channel.objects.select_for_update().filter(pk=channel.pk).first()
        Channel.objects.filter(pk=channel.pk).delete()
        deleted.set()
        # Commit only once the other thread waits on a lock this transaction holds.
        with connection.cursor() as cursor:
            waited = False
            for _ in range(3000):
                # Activity is a snapshot kept for the whole transaction unless cleared.
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                               "'Lock' AND datname = current_database()")
                if cursor.fetchone()[0]:
                    waited = True
                    break
                cursor.execute("SELECT pg_sleep(0.01)")
    queuer.join(30)
    result["waited"] = waited
    result["left"] = Notification.objects.count()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
