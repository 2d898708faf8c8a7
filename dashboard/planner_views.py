"""The fit planner page: a GET form over collectors.fitplan; planning changes nothing.

Below a plan of one of the node's engines, an admin with ``restarts.run_restarts`` finds the
form "Plan this restart with these flags": it posts to the restarts' plan view
(``dashboard:restart-plan``), which refuses in words what the fit planner or the plan's checks
refuse. The restarts app may not import alerting, so this module registers the prefill-squeeze
alert's margin as the one a restart plan's new flags are checked with.
"""

from __future__ import annotations

import shlex

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from collectors.docker_api import COMPOSE_PROJECT_LABEL
from collectors.fitplan import PlanError, PlanRequest, plan
from collectors.models import Engine, Node
from collectors.starts import history_for
from dashboard.alerting.settings import prefill_margin_bytes
from dashboard.restarts.change import NOTE, RECREATE
from dashboard.restarts.forms import PlanForm
from dashboard.restarts.planning import PERMISSION, can_run_restarts

NEW_ENGINE = "__new__"

def _command_text(engine: Engine) -> str:
    command = engine.command or []
    return shlex.join(command) if isinstance(command, list) else str(command)


@login_required
def planner_page(request: HttpRequest, node: str) -> HttpResponse:
    watched = get_object_or_404(Node, name=node)
    engines = list(Engine.objects.filter(node=watched, present=True).order_by("name"))
    vllm = [e for e in engines if e.kind == "vllm"]
    chosen = request.GET.get("engine") or (vllm[0].name if vllm else NEW_ENGINE)
    current = next((e for e in engines if e.name == chosen), None)
    command = request.GET.get("command")
    if command is None:
        command = _command_text(current) if current else ""
    version = request.GET.get("version", "")
    drop = request.GET.get("drop_page_cache") == "1"
    result, error = None, None
    if "command" in request.GET or current is not None:
        try:
            result = plan(watched, engines, PlanRequest(
                None if chosen == NEW_ENGINE else chosen, command, version or None, drop,
                history_for(current, watched) if current else None), prefill_margin_bytes())
        except PlanError as why:
            error = str(why)
    return render(request, "dashboard/planner.html", {
        "node": watched, "engines": engines, "chosen": chosen, "new_engine": NEW_ENGINE,
        "command": command, "version": version, "drop_page_cache": drop,
        "plan": result, "error": error,
        "restart": _restart_form(request, watched, current, command) if result else None,
    })


def _restart_form(request: HttpRequest, node: Node, engine: Engine | None,
                  command: str) -> dict[str, object] | None:
    """What the "Plan this restart with these flags" form needs (None for a new engine): the
    plan form with this engine and command, or why it is not offered."""
    if engine is None:
        return None
    if not can_run_restarts(request.user):
        return {"unavailable": f"Planning a restart needs the permission {PERMISSION}."}
    if not engine.manageable:
        return {"unavailable": f"{engine.name} is not enabled for management (label "
                               "sparkops.manage=true or an admin's setting): SparkOps does not "
                               "restart it."}
    compose = (engine.labels or {}).get(COMPOSE_PROJECT_LABEL)
    form = PlanForm(node=node, now=timezone.now(), initial={
        "engine": engine.pk, "command": command, "mode": NOTE if compose else RECREATE})
    return {"form": form, "engine": engine, "compose": compose}
