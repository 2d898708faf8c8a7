"""The audit page: every dangerous or configuration action, filterable, for those allowed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.test import Client
from django.urls import reverse

from collectors.models import Node
from dashboard.audit.models import AuditEntry
from dashboard.audit.records import audit
from tests.access import grant


@pytest.fixture
def auditor_client(django_user_model):
    user = django_user_model.objects.create_user("auditor", is_staff=True)
    client = Client()
    client.force_login(grant(user, "view_audit"))
    return client


@pytest.fixture
def history(node, django_user_model):
    """Five rows across actions, people, outcomes, nodes and days."""
    other = Node.objects.create(name="spark-b")
    alice = django_user_model.objects.create_user("alice")
    rows = [
        audit("plan-restart", allowed=True, user=alice, node=node, outcome="planned",
              address="192.0.2.1"),
        audit("drop-caches", allowed=True, actor="worker:spark-a", node=node,
              outcome="failed: helper exited 1"),
        audit("create-silence", allowed=False, user=alice, outcome="alice lacks the permission",
              address="192.0.2.2"),
        audit("edit-rule", allowed=True, user=alice, outcome="rule overcommit: saved"),
        audit("plan-restart", allowed=False, actor="bob", node=other, outcome="refused: busy"),
    ]
    days = [datetime(2026, 11, day, 12, 0, tzinfo=UTC) for day in (1, 2, 3, 4, 5)]
    for row, day in zip(rows, days, strict=True):
        AuditEntry.objects.filter(pk=row.pk).update(at=day)
    return rows


def listed(client, **query) -> list[str]:
    response = client.get(reverse("dashboard:audit"), query)
    assert response.status_code == 200
    return [row["entry"].outcome for row in response.context["rows"]]


def test_everything_newest_first_with_who_and_where(auditor_client, history):
    response = auditor_client.get(reverse("dashboard:audit"))

    page = response.content.decode()
    assert listed(auditor_client) == ["refused: busy", "rule overcommit: saved",
                                      "alice lacks the permission", "failed: helper exited 1",
                                      "planned"]
    assert "192.0.2.1" in page and "worker:spark-a" in page
    assert 'class="audit-failed"' in page and 'class="audit-refused"' in page


@pytest.mark.parametrize(("query", "expected"), [
    ({"action": "plan-restart"}, ["refused: busy", "planned"]),
    ({"user": "alice"}, ["rule overcommit: saved", "alice lacks the permission", "planned"]),
    ({"user": "worker:spark-a"}, ["failed: helper exited 1"]),
    ({"outcome": "refused"}, ["refused: busy", "alice lacks the permission"]),
    ({"outcome": "failed"}, ["failed: helper exited 1"]),
    ({"outcome": "allowed"}, ["rule overcommit: saved", "planned"]),
    ({"node": "spark-b"}, ["refused: busy"]),
    ({"since": "2026-11-02", "until": "2026-11-03"},
     ["alice lacks the permission", "failed: helper exited 1"]),
    ({"action": "plan-restart", "outcome": "allowed", "node": "spark-a"}, ["planned"]),
])
def test_filters(auditor_client, history, query, expected):
    assert listed(auditor_client, **query) == expected


def test_pages_of_fifty_keep_the_filter(auditor_client, node):
    AuditEntry.objects.bulk_create([AuditEntry(action="edit-rule", allowed=True,
                                               outcome=f"row {i}") for i in range(60)]
                                   + [AuditEntry(action="drop-caches", allowed=True)])

    first = auditor_client.get(reverse("dashboard:audit"), {"action": "edit-rule"})
    second = auditor_client.get(reverse("dashboard:audit"), {"action": "edit-rule", "page": 2})

    assert len(first.context["rows"]) == 50 and len(second.context["rows"]) == 10
    assert "action=edit-rule&amp;page=2" in first.content.decode()


def test_the_audit_page_needs_its_permission(django_user_model, history):
    staff = django_user_model.objects.create_user("staff", is_staff=True)
    client = Client()
    client.force_login(staff)

    response = client.get(reverse("dashboard:audit"))

    assert response.status_code == 403
    assert "staff lacks the permission to read the audit log (audit.view_audit)" in \
        response.content.decode()
    assert "/audit/" not in client.get(reverse("dashboard:alerts")).content.decode()


def test_the_nav_links_the_audit_page_for_those_allowed(auditor_client, db):
    assert 'href="/audit/"' in auditor_client.get(reverse("dashboard:alerts")).content.decode()
