"""Local mode answers like API Gateway (issue 8): unsupported methods, oversized bodies
and the authorizer's identity validation expression."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from gpu_recovery.api_routes import NODE_TOKEN_HEADER_PATTERN
from local_mode.server import MAX_REQUEST_BYTES, LocalApi, LocalApiServer, route_defined
from tests.heartbeat.node_api_calls import tasks_body
from tests.heartbeat.world import NODE, task_arn


def request(url: str, method: str, path: str, body: bytes = b"",
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("method", "path"),
    [("TRACE", "/v1/jobs"), ("TRACE", "/prod/v1/report_gpu"), ("DELETE", "/v1/jobs"),
     ("PUT", "/v1/jobs/abc"), ("GET", "/v1/report_tasks"), ("BREW", "/v1/jobs"),
     ("GET", "/v1/jobs/a/b/c"), ("POST", "/v1/nothing")],
)
def test_methods_and_paths_the_stage_does_not_define_are_403_json(world, method, path) -> None:
    """TRACE was answered 501 in HTML; API Gateway answers 403 (here in the APIs' error shape)."""
    with LocalApiServer() as server:
        status, headers, body = request(server.url, method, path)
    assert status == 403, body
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body)["error"] == "MISSING_AUTHENTICATION_TOKEN"


def test_route_table_is_the_deployed_one() -> None:
    assert route_defined("POST", "/v1/jobs/some-job/cancel")
    assert route_defined("GET", "/swagger") and not route_defined("POST", "/swagger")
    assert not route_defined("GET", "/v1/jobs//events")


def test_oversized_body_gets_a_readable_413(world) -> None:
    """The connection used to be closed before the client could read the 413."""
    with LocalApiServer() as server:
        status, _, body = request(server.url, "POST", "/v1/report_tasks",
                                        body=b"x" * (MAX_REQUEST_BYTES + 1),
                                        headers={"Content-Type": "application/json"})
    assert status == 413
    assert json.loads(body)["error"] == "REQUEST_TOO_LARGE"


def test_authorizer_identity_validation_expression_is_applied(world) -> None:
    """A token with trailing spaces (or another scheme) fails API Gateway's validation
    expression: 401 without the authorizer; it used to pass locally."""
    world.seed_job("j1", world_size=1)
    token = world.tokens.issue(NODE)
    api = LocalApi()
    body = json.dumps(tasks_body(world, task_arn("j1", 0))).encode()
    for header in (f"Bearer {token}   ", f"Token {token}", f"Bearer  {token}", "Bearer short"):
        response = api.handle("POST", "/v1/report_tasks", {"Authorization": header}, body)
        assert response.status == 401, header
        assert response.json()["error"] == "UNAUTHORIZED"
    assert api.handle("POST", "/v1/report_tasks", {"Authorization": f"bearer {token}"},
                      body).status == 200


def test_validation_expression_matches_issued_tokens(world) -> None:
    import re

    token = world.tokens.issue(NODE)
    assert re.fullmatch(NODE_TOKEN_HEADER_PATTERN, f"Bearer {token}")
