"""Real loopback servers that the test suite and the benchmarks both start.

The package sits in ``sparkops`` because ``tests/`` and ``bench/`` may both import ``sparkops``,
while ``bench/`` must not import ``tests/`` (a benchmark runs without the test suite's fixtures)
and the tests should not depend on the benchmark harness. Nothing here imports a SparkOps app:
only the standard library, the PostgreSQL binaries and ``standardwebhooks``.

- :mod:`sparkops.testing.ports`: a free loopback port, waiting for a listener or a condition.
- :mod:`sparkops.testing.postgres`: a private PostgreSQL cluster on a free port.
- :mod:`sparkops.testing.webhooks`: a webhook receiver that records, verifies and answers from
  a script.
"""
