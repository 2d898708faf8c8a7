"""Real Chromium for page tests: Debian's /usr/bin/chromium driven by Playwright (no download)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator

import pytest

CHROMIUM = os.environ.get("SPARKOPS_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialling Google's hosts, which a closed
# network refuses (many at a time).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing (Debian package chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; the ORM calls tests make are still
    # synchronous, so Django's guard is lifted while the browser runs. Subprocesses get an
    # environment without it (tests.conftest.subprocess_env).
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield instance
            instance.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


# A JavaScript function expression: `function …`, `x => …`, `(a, b) => …` (an IIFE is not one).
_FUNCTION = re.compile(r"\s*(async\s+)?(function\b|[\w$]+\s*=>|\([^()]*\)\s*=>)")


def _compile_predicates_as_functions(page) -> None:
    """Playwright polls a string predicate of ``wait_for_function`` with ``eval`` inside the
    page, which the pages' Content-Security-Policy forbids; a function is compiled through the
    debugging protocol instead, outside the policy. Wrap string predicates into functions."""
    original = page.wait_for_function

    def wait_for_function(expression: str, *args, **kwargs):
        if not _FUNCTION.match(expression):
            expression = f"() => ({expression})"
        return original(expression, *args, **kwargs)

    page.wait_for_function = wait_for_function


@pytest.fixture
def page(browser):
    context = browser.new_context()
    page = context.new_page()
    _compile_predicates_as_functions(page)
    yield page
    # Stop the page's polling and let the live server finish any request in flight before the
    # test's database access is switched off behind it.
    page.goto("about:blank")
    page.wait_for_timeout(500)
    context.close()
