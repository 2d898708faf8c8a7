"""Template context shared by every page."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def demo(request: HttpRequest) -> dict[str, bool]:
    """``demo``: this SparkOps shows demo data (``SPARKOPS_DEMO``), so every page says so."""
    return {"demo": settings.SPARKOPS_DEMO}
