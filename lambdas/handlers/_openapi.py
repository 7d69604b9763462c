"""What the three HTTP handlers' OpenAPI documents share: the error response of a route,
the Authorization-header security scheme, the committed document's form and the
``python -m handlers.<api> --openapi`` entry point that prints it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.event_handler.openapi.models import APIKey
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from pydantic import BaseModel, Field


# The body of every error the three APIs answer (here, not with the jobs API's models: the
# node API loads none of the queue's modules). No docstring: it would enter the documents.
class ErrorBody(BaseModel):
    error: str = Field(description="validation_error | not_found | conflict | payload_too_large | ...")
    message: str = Field(description="Human-readable; for 400 it starts with '<field>: '")
    field: str | None = Field(default=None, description="The offending field (400 only)")


def error_doc(description: str) -> OpenAPIResponse:
    """An error status of a route: its description, the body an :class:`ErrorBody`."""
    return {"description": description, "content": {"application/json": {"model": ErrorBody}}}


def authorization_header_scheme(description: str) -> APIKey:
    """A credential sent in the ``Authorization`` header."""
    # "in" is a keyword: the model takes it by its alias.
    return APIKey.model_validate({"type": "apiKey", "name": "Authorization", "in": "header",
                                  "description": description})


def as_answered(schema_json: str, **every_route: Any) -> dict[str, Any]:
    """The resolver's document (``schema_json``) with the status codes the API really answers:
    the resolver's generic 422 and its schemas dropped (a bad request is a 400 with an
    :class:`ErrorBody`); ``every_route``: status -> response that every route may answer."""
    document: dict[str, Any] = json.loads(schema_json)
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            responses.pop("422", None)
            for status, response in every_route.items():
                responses.setdefault(status, response)
    schemas = document.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return document


def document_json(document: dict[str, Any]) -> str:
    """The committed form: stable key order, newline-terminated."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def print_document(module: str, committed_as: str, document: Callable[[], dict[str, Any]],
                   argv: list[str] | None = None) -> int:
    """``python -m handlers.<module> --openapi`` prints the document (exit 0), else usage (2)."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["--openapi"]:
        print(f"usage: python -m handlers.{module} --openapi > {committed_as}", file=sys.stderr)
        return 2
    sys.stdout.write(document_json(document()))
    return 0
