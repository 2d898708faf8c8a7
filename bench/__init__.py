"""SparkOps benchmarks: what it costs and how fast it answers, next to the Prometheus stack.

Not part of the test suite. ``bench/run`` runs every benchmark in one go and writes
``bench/RESULTS.md``; see ``bench/README.md``.
"""
