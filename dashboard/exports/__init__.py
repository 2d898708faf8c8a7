"""SparkOps' own exports: Prometheus ``/metrics`` and the read-only JSON API ``/api/v1/``.

``access`` decides who may read them (a bearer token or an allowlisted address), ``figures``
reads the current figures once for both, ``metrics`` and ``api`` render them.
"""
