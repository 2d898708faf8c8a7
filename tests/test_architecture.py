"""The import rule of docs/ARCHITECTURE.md, checked on every module's imports.

Every ``import`` and ``from ... import`` is read with ``ast`` (top level, inside functions and
under ``TYPE_CHECKING`` alike), its module resolved (relative imports included), and both sides
placed in a component. A violation is reported as ``path:line``, so the failure says where.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import PROJECT

CHECKED = ("collectors", "dashboard", "sparkops", "bench")
DOMAIN_APPS = ("audit", "alerting", "notify", "restarts", "exports")
BASE = {"collectors", "sparkops"}

# Component -> the components it may import (its own is always allowed). Anything not listed
# (the standard library, Django, other packages) is allowed everywhere.
MAY_IMPORT: dict[str, set[str]] = {
    # The node side reads the node and stores what it read; it never names the centre.
    "collectors": {"sparkops"},
    # Settings, Celery, the supervisor, the HTTP library, the test servers: below every app.
    "sparkops": set(),
    # The demo drives both halves, from above them.
    "sparkops.demo": BASE | {"audit", "alerting", "notify", "restarts"},
    # The domain apps, bottom to top; none imports the pages.
    "audit": BASE,
    "restarts": BASE | {"audit"},
    "notify": BASE | {"audit"},
    "alerting": BASE | {"audit", "notify", "restarts"},
    "exports": BASE | {"audit", "alerting", "restarts"},
    # The pages show everything.
    "pages": BASE | set(DOMAIN_APPS),
    # Benchmarks drive the product as a user would, never through the test suite.
    "bench": BASE | set(DOMAIN_APPS) | {"pages", "sparkops.demo"},
    "tests": BASE | set(DOMAIN_APPS) | {"pages", "sparkops.demo", "bench"},
}


def component(module: str) -> str | None:
    """The component a dotted module name belongs to; None outside the project."""
    parts = module.split(".")
    top = parts[0]
    if top in ("collectors", "bench", "tests"):
        return top
    if top == "sparkops":
        demo = parts[1:2] == ["demo"] or parts[1:4] == ["management", "commands", "demo"]
        return "sparkops.demo" if demo else "sparkops"
    if top == "dashboard":
        return parts[1] if len(parts) > 1 and parts[1] in DOMAIN_APPS else "pages"
    return None


def module_name(path: Path) -> str:
    relative = path.relative_to(PROJECT).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, dotted module) for every import in ``source``; ``from a import b`` yields
    ``a.b`` as well as ``a``, since ``b`` may be a module."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def violations_in(source: str, module: str, where: str, is_package: bool = False) -> list[str]:
    """Every import of ``source`` (the module ``module``) that the rule forbids."""
    own = component(module)
    if own is None or own not in MAY_IMPORT:
        return []
    found = []
    for line, target in imported_modules(source, module, is_package):
        other = component(target)
        if other is None or other == own or other in MAY_IMPORT[own]:
            continue
        found.append(f"{where}:{line}: {own} imports {target} ({other})")
    return sorted(set(found))


def project_modules() -> Iterator[Path]:
    for top in CHECKED:
        for path in sorted((PROJECT / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def test_every_module_keeps_the_import_rule():
    broken = []
    for path in project_modules():
        broken += violations_in(path.read_text(), module_name(path),
                                str(path.relative_to(PROJECT)), path.name == "__init__.py")
    assert not broken, "imports that break docs/ARCHITECTURE.md:\n" + "\n".join(broken)


def test_the_check_sees_imports_everywhere_in_a_module():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import collectors.models\n"
        "if TYPE_CHECKING:\n"
        "    from dashboard.alerting.models import Alert\n"
        "def later():\n"
        "    from dashboard import views\n"
        "    import sparkops.demo.story\n"
    )
    assert violations_in(source, "collectors.tasks", "collectors/tasks.py") == [
        "collectors/tasks.py:4: collectors imports dashboard.alerting.models (alerting)",
        "collectors/tasks.py:4: collectors imports dashboard.alerting.models.Alert (alerting)",
        "collectors/tasks.py:6: collectors imports dashboard (pages)",
        "collectors/tasks.py:6: collectors imports dashboard.views (pages)",
        "collectors/tasks.py:7: collectors imports sparkops.demo.story (sparkops.demo)",
    ]


def test_relative_imports_are_resolved_before_judging():
    assert violations_in("from ..views import home\n", "dashboard.audit.records",
                         "dashboard/audit/records.py") == [
        "dashboard/audit/records.py:1: audit imports dashboard.views (pages)",
        "dashboard/audit/records.py:1: audit imports dashboard.views.home (pages)",
    ]
    assert violations_in("from . import records\n", "dashboard.audit", "x", is_package=True) == []


def test_the_domain_apps_sit_in_order():
    assert component("dashboard.restarts.models") == "restarts"
    assert component("dashboard.engines") == "pages"
    assert component("sparkops.management.commands.demo") == "sparkops.demo"
    assert violations_in("from dashboard.alerting import models\n", "dashboard.restarts.views",
                         "v.py") == ["v.py:1: restarts imports dashboard.alerting (alerting)",
                                     "v.py:1: restarts imports dashboard.alerting.models "
                                     "(alerting)"]
    assert violations_in("from dashboard.restarts.models import Restart\n",
                         "dashboard.audit.models", "m.py") != []
