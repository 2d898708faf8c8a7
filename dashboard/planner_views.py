"""The fit planner page: a GET form over collectors.fitplan; planning changes nothing."""

from __future__ import annotations

import shlex

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from collectors.fitplan import PlanError, PlanRequest, plan
from collectors.models import Engine, Node
from dashboard.alerting.settings import prefill_margin_bytes

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
                None if chosen == NEW_ENGINE else chosen, command, version or None, drop),
                prefill_margin_bytes())
        except PlanError as why:
            error = str(why)
    return render(request, "dashboard/planner.html", {
        "node": watched, "engines": engines, "chosen": chosen, "new_engine": NEW_ENGINE,
        "command": command, "version": version, "drop_page_cache": drop,
        "plan": result, "error": error,
    })
