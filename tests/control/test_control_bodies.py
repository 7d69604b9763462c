"""The control API's one body (a preflight report) refused before routing when it is not
JSON: a 415 or a 400 in the error shape, never the resolver's 502 (the fuzzer's
multipart/form-data without a boundary was one)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handlers import job_control_api
from tests.jobs_api.api_harness import FakeContext, api_event

REPORT = json.dumps({"round": 1, "test_id": "loopback", "exit_code": 0, "output": "", "seconds": 0.0})


def report_event(raw_body: str, content_type: str) -> dict[str, Any]:
    event = api_event("POST", "/v1/control/preflight", raw_body=raw_body,
                      headers={"Content-Type": content_type}, user_arn=None)
    event["queryStringParameters"] = {"attempt": "1"}
    return event


@pytest.mark.parametrize(("raw_body", "content_type", "status", "field"), [
    pytest.param(REPORT, "multipart/form-data", 415, "Content-Type", id="multipart"),
    pytest.param(REPORT, "application/x-www-form-urlencoded", 415, "Content-Type", id="form"),
    pytest.param("not json", "application/json", 400, "body", id="not-json"),
    pytest.param("[" * 6_000 + "]" * 6_000, "application/json", 400, "body", id="6000-deep"),
    pytest.param(REPORT + "x" * 20_000, "application/json", 413, "body", id="too-large"),
])
def test_a_report_that_is_not_json_is_a_4xx_naming_what_to_fix(raw_body: str, content_type: str, status: int,
                                                                field: str) -> None:
    response = job_control_api.lambda_handler(report_event(raw_body, content_type), FakeContext())
    body = json.loads(response["body"])
    assert response["statusCode"] == status, body
    assert body.get("field") == field and isinstance(body.get("message"), str), body
