"""SparkOps' release number, shown by ``/healthz``, ``bin/sparkops status`` and the start-up
summary.

Releases:

* 0.2.0 — this release: health and readiness endpoints, ``status``, ``backup`` and ``restore``,
  quiet logs.
* 0.1.0 — the previous release, the tree of git commit cc9d0b2. Its database is kept in
  ``tests/fixtures/releases/sparkops-0.1.0.sqlite3`` and an upgrade from it is tested
  (``tests/test_upgrade_release.py``).
"""

VERSION = "0.2.0"
