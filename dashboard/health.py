"""``/healthz`` (liveness) and ``/readyz`` (readiness), for probes: no login, plain JSON.

``/healthz`` answers as long as the web process serves requests, asking nothing of the database
or the broker: a restart of the web server is the cure for it failing. ``/readyz`` answers 200
when the database and broker answer and this node's collection is current, 503 with each
check's reason otherwise (``collectors.health``): the cure is elsewhere, not a restart.

Both answer plain HTTP even with ``SPARKOPS_HTTPS=1`` (``SECURE_REDIRECT_EXEMPT``), so a local
probe needs no certificate; the host names of ``SPARKOPS_ALLOWED_HOSTS`` still apply. Neither is
cached.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from collectors.health import readiness
from sparkops.version import VERSION


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok", "version": VERSION})


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    result = readiness()
    response = JsonResponse(result.as_dict(), status=200 if result.ok else 503)
    # Django logs every 5xx as an error ("Service Unavailable: /readyz"): a probe asking every
    # few seconds while a node is not ready would fill the log with it. The answer says why;
    # django.request skips a response marked as logged already.
    response._has_been_logged = True
    return response


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
]
