"""The committed OpenAPI document matches the resolver; Swagger UI is served."""

from __future__ import annotations

import json
from pathlib import Path

from handlers import jobs_api
from handlers._openapi import document_json
from tests.jobs_api.api_harness import Api, FakeContext, api_event

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_committed_openapi_matches_the_resolver() -> None:
    """Given docs/openapi.json
    When the resolver generates its OpenAPI document
    Then both are identical (regenerate: python -m handlers.jobs_api --openapi > docs/openapi.json)."""
    assert OPENAPI.read_text() == document_json(jobs_api.openapi_document()), (
        "docs/openapi.json drifted: run `PYTHONPATH=lambdas python -m handlers.jobs_api --openapi "
        "> docs/openapi.json`"
    )


def test_openapi_documents_every_route() -> None:
    """Given the generated document
    When its paths are read
    Then every route and its JobSpec body are there."""
    document = json.loads(document_json(jobs_api.openapi_document()))
    paths = document["paths"]
    assert set(paths) >= {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel",
                          "/v1/jobs/{job_id}/events", "/v1/jobs/{job_id}/logs"}
    assert set(paths["/v1/jobs"]) == {"get", "post"}
    assert "201" in paths["/v1/jobs"]["post"]["responses"]
    assert "JobSpec" in document["components"]["schemas"]


def test_cli_prints_the_document(capsys) -> None:
    """Given the module entry point
    When run with --openapi
    Then it prints the document; without it, usage and exit code 2."""
    assert jobs_api.main(["--openapi"]) == 0
    assert capsys.readouterr().out == document_json(jobs_api.openapi_document())
    assert jobs_api.main([]) == 2


def test_swagger_ui_is_served(api: Api) -> None:
    """Given the API
    When /swagger is requested
    Then an HTML page is returned."""
    response = jobs_api.lambda_handler(api_event("GET", "/swagger"), FakeContext())
    assert response["statusCode"] == 200
    assert "swagger" in response["body"].lower()


def test_openapi_states_the_real_status_codes() -> None:
    """Every operation documented 422 while the API answers 400, and 415 was undocumented
    (its body not ErrorBody): now the document lists what the API and API Gateway answer,
    each error with the ErrorBody schema."""
    document = json.loads(OPENAPI.read_text())
    assert all("422" not in op["responses"] for ops in document["paths"].values() for op in ops.values())
    assert "HTTPValidationError" not in document["components"]["schemas"]
    submit = document["paths"]["/v1/jobs"]["post"]["responses"]
    assert {"201", "400", "403", "409", "413", "415", "429"} <= set(submit)
    for ops in document["paths"].values():
        for op in ops.values():
            for code, response in op["responses"].items():
                if code.startswith("4"):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (code, schema)
