"""Who may read the exports: the export token, an allowlisted address, and nobody else."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.exports.world import TOKEN

PATHS = [
    "/metrics",
    "/api/v1/nodes",
    "/api/v1/nodes/spark-a/ledger",
    "/api/v1/nodes/spark-a/engines",
    "/api/v1/nodes/spark-a/restarts",
    "/api/v1/alerts",
]
DISABLED = "exports are disabled: set SPARKOPS_EXPORT_TOKEN or SPARKOPS_EXPORT_ALLOWED_NETWORKS"


@pytest.fixture
def token_and_allowlist(settings) -> None:
    settings.SPARKOPS_EXPORT_TOKEN = TOKEN
    settings.SPARKOPS_EXPORT_ALLOWED_NETWORKS = ["10.0.0.0/8", "fd00:1::/64"]


@pytest.mark.parametrize("path", PATHS)
def test_the_export_token_opens_every_export(client, node, bearer, path):
    response = client.get(path, headers=bearer)

    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"


def test_the_scheme_is_case_insensitive(client, node, exports_token):
    response = client.get("/metrics", headers={"Authorization": f"bearer {exports_token}"})

    assert response.status_code == 200


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("header", [
    f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", f"Basic {TOKEN}",
])
def test_a_wrong_or_missing_token_is_refused_with_a_bearer_challenge(client, node, exports_token,
                                                                     path, header):
    response = client.get(path, headers={"Authorization": header})

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert response["Cache-Control"] == "no-store"
    assert "error" in response.json()


def test_no_credential_at_all_is_asked_for_the_token(client, node, exports_token):
    response = client.get("/metrics")

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="sparkops"'


@pytest.mark.parametrize("address", ["10.1.2.3", "::ffff:10.1.2.3", "fd00:1::42"])
def test_an_allowlisted_address_needs_no_token(client, node, token_and_allowlist, address):
    response = client.get("/metrics", REMOTE_ADDR=address)

    assert response.status_code == 200


@pytest.mark.parametrize("address", ["192.168.1.5", "127.0.0.1", "fd00:2::1", ""])
def test_another_address_without_the_token_is_refused(client, node, token_and_allowlist,
                                                      address):
    response = client.get("/api/v1/nodes", REMOTE_ADDR=address)

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_forwarded_for_headers_do_not_make_an_address_allowlisted(client, node,
                                                                  token_and_allowlist):
    response = client.get("/metrics", REMOTE_ADDR="192.168.1.5",
                          headers={"X-Forwarded-For": "10.1.2.3", "X-Real-IP": "10.1.2.3"})

    assert response.status_code == 401


def test_a_wrong_token_is_refused_even_from_an_allowlisted_address(client, node,
                                                                   token_and_allowlist):
    response = client.get("/metrics", REMOTE_ADDR="10.1.2.3",
                          headers={"Authorization": "Bearer not-the-token"})

    assert response.status_code == 401
    assert 'error="invalid_token"' in response["WWW-Authenticate"]


def test_with_only_an_allowlist_other_addresses_are_forbidden(client, node, settings):
    settings.SPARKOPS_EXPORT_TOKEN = None
    settings.SPARKOPS_EXPORT_ALLOWED_NETWORKS = ["10.0.0.0/8"]

    allowed = client.get("/metrics", REMOTE_ADDR="10.9.9.9")
    refused = client.get("/metrics", REMOTE_ADDR="192.168.1.5",
                         headers={"Authorization": "Bearer anything"})

    assert allowed.status_code == 200
    assert refused.status_code == 403
    assert "WWW-Authenticate" not in refused  # no token could help
    assert refused.json()["error"] == (
        "192.168.1.5 is not in SPARKOPS_EXPORT_ALLOWED_NETWORKS and no SPARKOPS_EXPORT_TOKEN is set"
    )


@pytest.mark.parametrize("path", PATHS)
def test_exports_are_disabled_until_a_token_or_an_allowlist_is_set(client, node, settings, path):
    settings.SPARKOPS_EXPORT_TOKEN = None
    settings.SPARKOPS_EXPORT_ALLOWED_NETWORKS = []

    response = client.get(path, headers={"Authorization": "Bearer anything"})

    assert response.status_code == 403
    assert response.json() == {"error": DISABLED}


@pytest.mark.parametrize("path", PATHS)
def test_a_logged_in_session_alone_is_not_enough(admin_client, node, exports_token, path):
    response = admin_client.get(path)

    assert response.status_code == 401


def test_a_logged_in_session_is_not_enough_for_an_allowlist_only_setup(admin_client, node,
                                                                       settings):
    settings.SPARKOPS_EXPORT_TOKEN = None
    settings.SPARKOPS_EXPORT_ALLOWED_NETWORKS = ["10.0.0.0/8"]

    assert admin_client.get("/metrics").status_code == 403


def test_a_malformed_allowlist_is_a_configuration_error_naming_the_variable(client, node,
                                                                            settings):
    settings.SPARKOPS_EXPORT_TOKEN = TOKEN
    settings.SPARKOPS_EXPORT_ALLOWED_NETWORKS = ["10.0.0.0/33"]

    with pytest.raises(ImproperlyConfigured, match="SPARKOPS_EXPORT_ALLOWED_NETWORKS"):
        client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_exports_are_read_only(client, node, bearer, path, method):
    response = getattr(client, method)(path, headers=bearer)

    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"


def test_the_access_rule_comes_before_the_method(client, node, exports_token):
    # An anonymous POST learns nothing about what the endpoint would accept.
    assert client.post("/metrics").status_code == 401
