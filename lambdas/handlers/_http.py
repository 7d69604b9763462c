"""Request-body guards shared by the HTTP handlers: every way a body can be malformed
becomes a :class:`BodyError` (a 4xx with the error shape), never an exception that
API Gateway would turn into a 502.

* base64 that does not decode, bytes that are not UTF-8 -> 400
* more than ``max_bytes`` -> 413
* JSON nested deeper than ``MAX_JSON_DEPTH`` (checked before parsing, so the parser's
  recursion never runs away), invalid JSON, numbers out of any range -> 400
* strings with lone UTF-16 surrogates (``"\\ud800"``: valid JSON, but not storable as
  UTF-8 in DynamoDB) -> 400
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

MAX_JSON_DEPTH = 32


class BodyError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str = "body") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field

    def body(self) -> dict[str, str]:
        return {"error": self.code, "message": self.message, "field": self.field}


def raw_bytes(event: dict[str, Any]) -> bytes:
    """The request body as bytes (base64-decoded when API Gateway encoded it)."""
    raw = event.get("body") or ""
    if event.get("isBase64Encoded"):
        try:
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as error:
            raise BodyError(400, "malformed_body", "body: is not valid base64") from error
    if isinstance(raw, bytes):
        return raw
    try:
        return str(raw).encode("utf-8")
    except UnicodeEncodeError as error:
        raise BodyError(400, "malformed_body", "body: is not valid UTF-8 text") from error


def body_text(event: dict[str, Any], max_bytes: int) -> str:
    """The body as text: size-checked (413) and UTF-8-checked (400)."""
    data = raw_bytes(event)
    if len(data) > max_bytes:
        raise BodyError(413, "payload_too_large",
                        f"body: is {len(data)} bytes; the limit is {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BodyError(400, "malformed_body",
                        f"body: is not valid UTF-8 (byte {error.start}); send JSON encoded as UTF-8"
                        ) from error


def too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when JSON text nests objects/arrays deeper than ``limit`` (strings skipped)."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def parse_json(text: str) -> Any:
    """JSON text -> value, or :class:`BodyError` (400) saying what is wrong."""
    if too_deep(text):
        raise BodyError(400, "malformed_json",
                        f"body: JSON is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, int digits limit
        raise BodyError(400, "malformed_json", f"body: is not valid JSON ({error})"[:300]) from error
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise BodyError(400, "malformed_json",
                        "body: contains a lone UTF-16 surrogate escape (e.g. \\ud800); "
                        "strings must be valid Unicode") from error
    except (ValueError, RecursionError) as error:
        raise BodyError(400, "malformed_json", "body: is not valid JSON") from error
    return value


def media_type(headers: dict[str, Any] | None) -> str:
    """The Content-Type's media type, lower case, without parameters ('' when absent)."""
    for key, value in (headers or {}).items():
        if str(key).lower() == "content-type":
            return str(value or "").split(";", 1)[0].strip().lower()
    return ""


JSON_MEDIA_TYPES = ("application/json", "")  # no Content-Type: taken as JSON


def guarded_body(event: dict[str, Any], max_bytes: int, *, json_route: bool) -> str:
    """The body as UTF-8 text, everything that can be wrong with it a :class:`BodyError` (a
    4xx) before routing: size (413), encoding (400) and, on a route that takes JSON, its
    media type (415) and JSON (400); so the resolver's own parsing cannot fail."""
    text = body_text(event, max_bytes)
    if json_route:
        media = media_type(event.get("headers"))
        if media not in JSON_MEDIA_TYPES:
            raise BodyError(415, "unsupported_media_type",
                            f"Content-Type: {media} is not supported; send application/json", "Content-Type")
        if text.strip():
            parse_json(text)
    return text
