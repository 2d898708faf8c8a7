"""``python -m sparkops.runworker [--quiet] worker ...``: a node's Celery worker as a process of
its own (``runstack --stack processes``, ``runagent``).

It runs as ``celery -A sparkops.stackworker`` would, with the project's app and its worker
options, but runs Celery's worker command alone (``sparkops.stackworker.run_worker``): Celery's
command-line group would import every subcommand, the ``amqp`` shell's libraries among them,
about 7 MiB resident in every worker. Only ``worker`` is accepted.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    # Celery's SIGHUP restart re-runs sys.executable with sys.argv: this module again, by name.
    sys.argv = ["-m", "sparkops.runworker", *argv]
    from sparkops.stackworker import run_worker

    return run_worker(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
