"""SigV4 for API Gateway endpoints (service ``execute-api``), with botocore's signer."""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

SIGV4_SERVICE = "execute-api"

_AWS_HOST_RE = re.compile(r"\.amazonaws\.com(\.cn)?$")
_EXECUTE_API_REGION_RE = re.compile(r"\.execute-api\.([a-z0-9-]+)\.(?:vpce\.)?amazonaws\.com(?:\.cn)?$")


def needs_sigv4(url: str) -> bool:
    """True when *url* points at AWS (API Gateway): its host ends with ``.amazonaws.com``."""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    return bool(_AWS_HOST_RE.search(host))


def region_from_url(url: str) -> str | None:
    """The region of an ``<id>.execute-api.<region>.amazonaws.com`` URL, else None."""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    match = _EXECUTE_API_REGION_RE.search(host)
    return match.group(1) if match else None


def sign_request(method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                 credentials: Any, region: str, *, service: str = SIGV4_SERVICE,
                 now: datetime | None = None) -> dict[str, str]:
    """Return *headers* plus the SigV4 headers (Authorization, X-Amz-Date, ...) for a request.

    Everything in *headers* is signed (so pass Idempotency-Key and Content-Type here), as is
    the SHA-256 of *body* (also sent as ``X-Amz-Content-SHA256``). *credentials* is a botocore
    ``Credentials`` (or anything with ``get_frozen_credentials()`` / access_key, secret_key,
    token). *now* fixes the signing time (tests); default: the current time.
    """
    from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
    from botocore.awsrequest import AWSRequest

    class _SigV4Auth(SigV4Auth):
        def _modify_request_before_signing(self, request: Any) -> None:
            if now is not None:
                request.context["timestamp"] = now.astimezone(UTC).strftime(SIGV4_TIMESTAMP)
            super()._modify_request_before_signing(request)

    if hasattr(credentials, "get_frozen_credentials"):
        credentials = credentials.get_frozen_credentials()
    payload = body or b""
    all_headers = dict(headers)
    all_headers["X-Amz-Content-SHA256"] = hashlib.sha256(payload).hexdigest()
    request = AWSRequest(method=method.upper(), url=url, data=payload, headers=all_headers)
    _SigV4Auth(credentials, service, region).add_auth(request)
    return {k: v for k, v in request.headers.items()}
