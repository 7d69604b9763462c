"""The committed control-API document (the fuzz test's schema) is the handler's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handlers import job_control_api
from handlers._openapi import document_json

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "control-api.openapi.json"


def test_committed_control_openapi_matches_the_handler() -> None:
    assert COMMITTED.read_text() == document_json(job_control_api.openapi_document()), (
        "docs/control-api.openapi.json drifted: run `PYTHONPATH=lambdas python -m handlers.job_control_api "
        "--openapi > docs/control-api.openapi.json`")


def test_the_document_has_its_routes_behind_the_control_token() -> None:
    document = json.loads(COMMITTED.read_text())
    assert {path: set(ops) for path, ops in document["paths"].items()} == {
        "/v1/control": {"get"}, "/v1/control/suspend": {"post"}, "/v1/control/checkpoint": {"post"},
        "/v1/control/preflight": {"get", "post"}}
    assert document["security"] == [{"controlToken": []}]
    assert document["components"]["securitySchemes"]["controlToken"]["name"] == "Authorization"
    suspend = document["paths"]["/v1/control/suspend"]["post"]["responses"]
    assert {"200", "401", "403", "409"} <= set(suspend)
    assert all("422" not in op["responses"] for ops in document["paths"].values() for op in ops.values())


def test_cli_prints_the_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert job_control_api.main(["--openapi"]) == 0
    assert capsys.readouterr().out == document_json(job_control_api.openapi_document())
    assert job_control_api.main([]) == 2
