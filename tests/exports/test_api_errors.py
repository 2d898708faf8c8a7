"""Every answer under ``/api/v1/`` is JSON: unknown paths and methods included."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("path", [
    "/api/v1/", "/api/v1/nope", "/api/v1/nodes/", "/api/v1/nodes/spark-a/ledger/",
    "/api/v1/nodes/not%20a%20slug/engines", "/api/v1/nodes/spark-a/gpus",
])
@pytest.mark.parametrize("debug", [False, True])
def test_an_unknown_api_path_is_a_json_404_that_says_what_exists(client, bearer, db, settings,
                                                                 path, debug):
    settings.DEBUG = debug
    response = client.get(path, headers=bearer)

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error.startswith("no API endpoint at /api/v1/")
    assert "/api/v1/nodes/<node>/ledger" in error


def test_any_method_on_an_unknown_api_path_is_a_json_404(client, bearer, db):
    response = client.post("/api/v1/nope", {"x": "1"}, headers=bearer)

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"


def test_a_write_to_an_endpoint_is_a_json_405(client, bearer, db):
    response = client.delete("/api/v1/alerts", headers=bearer)

    assert response.status_code == 405
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"error": "DELETE is not allowed here; exports are read-only"}


def test_an_unknown_path_asks_for_the_token_first(client, exports_token, db):
    """A client without access learns nothing about which paths exist."""
    response = client.get("/api/v1/nope")

    assert response.status_code == 401
    assert response["Content-Type"] == "application/json"
