"""Fixtures of the export tests: exports enabled with a known token, the seeded world."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.utils import timezone

from collectors.models import Node
from tests.exports.world import TOKEN, World, build


@pytest.fixture
def now() -> datetime:
    return timezone.now()


@pytest.fixture
def exports_token(settings) -> str:
    """Exports enabled by token only (no allowlist): every request must present it."""
    settings.SPARKOPS_EXPORT_TOKEN = TOKEN
    settings.SPARKOPS_EXPORT_ALLOWED_NETWORKS = []
    return TOKEN


@pytest.fixture
def bearer(exports_token: str) -> dict[str, str]:
    """Request headers carrying the export token."""
    return {"Authorization": f"Bearer {exports_token}"}


@pytest.fixture
def world(node: Node, now: datetime) -> World:
    return build(node, now)
