"""The Content-Security-Policy: every page says where scripts, styles and data may come from,
and the templates stay within it (no inline script, no event-handler attribute)."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from collectors.models import Node
from tests.conftest import GIB, PROJECT


def _policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    directives = [part.split() for part in header.split(";") if part.strip()]
    return {name: values for name, *values in directives}


def test_pages_carry_a_policy_that_allows_only_this_sites_scripts(client, db):
    policy = _policy(client.get("/login/"))

    assert policy["default-src"] == ["'self'"]
    assert policy["script-src"] == ["'self'"]  # no 'unsafe-inline', no 'unsafe-eval'
    assert policy["connect-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"] and policy["base-uri"] == ["'none'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["form-action"] == ["'self'"]


def test_logged_in_pages_carry_it_too(admin_client, node):
    response = admin_client.get(f"/nodes/{node.name}/")

    assert response.status_code == 200
    assert "script-src 'self'" in response["Content-Security-Policy"]


def test_no_template_has_inline_script_or_event_handler_attributes():
    """script-src 'self' blocks both; a page relying on one would silently break."""
    inline_script = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>")
    handler = re.compile(r"<[a-z][^>]*\son[a-z]+\s*=", re.IGNORECASE)
    offenders = [
        f"{path.relative_to(PROJECT)}: {match.group(0)[:80]}"
        for path in sorted((PROJECT / "templates").rglob("*.html"))
        for pattern in (inline_script, handler)
        for match in pattern.finditer(path.read_text())
    ]
    assert offenders == []


# --- in a real browser ---------------------------------------------------------------------------

BROWSED = ["/fleet/", "/nodes/spark-a/", "/nodes/spark-a/engines/gemma-4-26b/",
           "/nodes/spark-a/engines/nemotron-120b/", "/alerts/", "/silences/", "/rules/",
           "/restarts/", "/restarts/windows/", "/channels/", "/admin/"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_pages_work_under_the_policy_in_a_real_browser(live_server, page, django_user_model,
                                                           settings):
    """Charts draw, controls work, and the browser reports no violation on any main page."""
    from tests.test_browser_pages import PASSWORD, STEP, seed_world

    settings.SPARKOPS_NODE_NAME = "spark-a"
    settings.SPARKOPS_COLLECT_INTERVAL = float(STEP)
    node = Node.objects.create(name="spark-a", mem_total_bytes=int(121.69 * GIB))
    Node.objects.create(name="spark-b", mem_total_bytes=int(121.69 * GIB))
    seed_world(node, timezone.now(), squeeze_alert=True)
    django_user_model.objects.create_superuser("admin", "", PASSWORD)
    refused: list[str] = []
    page.on("console", lambda message: refused.append(message.text)
            if "Content Security Policy" in message.text else None)
    page.add_init_script("""window.__cspViolations = [];
        document.addEventListener('securitypolicyviolation', e =>
            window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));""")

    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("#fleet")  # two nodes: the fleet view is the home page
    violations: dict[str, list[str]] = {}
    for path in BROWSED:
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
        if path.startswith("/nodes/"):  # plotly drew its SVG chart
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=15_000)
        found = page.evaluate("window.__cspViolations")
        if found:
            violations[path] = found
    assert violations == {} and refused == []

    # The controls that were inline handlers: the node picker and the node filter.
    page.goto(f"{live_server.url}/nodes/spark-a/")
    with page.expect_navigation():
        page.select_option(".node-picker select", label="spark-b")
    assert page.url.endswith("/nodes/spark-b/")
    page.goto(f"{live_server.url}/alerts/")
    with page.expect_navigation():
        page.select_option("select[name=node]", label="spark-a")
    assert "node=spark-a" in page.url
