"""The CLI's expected errors: one line on stderr, an exit code."""

from __future__ import annotations

import http.client
import json

from cli.gpujobs.constants import EXIT_CLIENT, EXIT_SERVER


class CliError(Exception):
    """An expected error: printed as one line on stderr, mapped to an exit code."""

    def __init__(self, message: str, *, exit_code: int = EXIT_CLIENT, field: str | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.field = field
        self.status = status


class ApiError(CliError):
    """A non-2xx answer from the API (or no answer at all: ``status`` None)."""

    @classmethod
    def from_response(cls, status: int, reason: str, body: bytes) -> ApiError:
        message, field = _error_message(body)
        if not message:
            message = reason or http.client.responses.get(status, "error")
        code = EXIT_CLIENT if 400 <= status < 500 else EXIT_SERVER
        return cls(f"HTTP {status}: {message}", exit_code=code, field=field, status=status)


def _error_message(body: bytes) -> tuple[str, str | None]:
    text = body.decode("utf-8", errors="replace").strip()
    if not text:
        return "", None
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:300], None
    if isinstance(doc, dict):
        # Powertools / our API: {"message", "field"}; API Gateway IAM errors use "Message".
        message = doc.get("message") or doc.get("Message") or doc.get("error") or ""
        field = doc.get("field")
        return str(message) if message else text[:300], str(field) if field else None
    return text[:300], None
