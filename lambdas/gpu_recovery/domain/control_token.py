"""The per-rank job-control token: what training code shows the control API.

``<job_id>.<rank>.<mac>`` where ``mac`` is HMAC-SHA256 of ``<job_id>.<rank>`` under the
job's random ``control_secret`` (kept on the job item, made at submit). The launcher puts
the token in each rank's environment; the control API's authorizer recomputes it. A token
names one rank of one job and grants only that job's suspend channel: no AWS credentials
are needed in the container. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Callable

MAC_CHARS = 40
SECRET_BYTES = 32
# Job ids are [a-z0-9-] (queue ids), so "." separates the parts unambiguously; the whole
# token fits the API's identity-validation expression ([A-Za-z0-9_.-]{16,512}).
_TOKEN = re.compile(r"^(?P<job>[a-z0-9][a-z0-9-]{0,80})\.(?P<rank>\d{1,4})\.(?P<mac>[0-9a-f]{40})$")


def new_secret() -> str:
    return secrets.token_hex(SECRET_BYTES)


def _mac(job_id: str, rank: int, secret: str) -> str:
    return hmac.new(secret.encode(), f"{job_id}.{rank}".encode(), hashlib.sha256).hexdigest()[:MAC_CHARS]


def make_token(job_id: str, rank: int, secret: str) -> str:
    return f"{job_id}.{rank}.{_mac(job_id, rank, secret)}"


def parse_token(token: str) -> tuple[str, int] | None:
    """(job id, rank) of a well-formed token (not yet verified), else None."""
    match = _TOKEN.match(token or "")
    if not match:
        return None
    return match["job"], int(match["rank"])


def verify_token(token: str, secret: str) -> tuple[str, int] | None:
    """(job id, rank) when ``token`` was made with ``secret``, else None."""
    parsed = parse_token(token)
    if parsed is None or not secret:
        return None
    job_id, rank = parsed
    if not hmac.compare_digest(make_token(job_id, rank, secret), token):
        return None
    return parsed


def authorize(token: str, secret_of: Callable[[str], str]) -> tuple[str, int] | None:
    """(job id, rank) of a valid token, else None; ``secret_of(job_id)`` is the job's secret
    ("" for no such job), asked only for a well-formed token."""
    parsed = parse_token(token)
    if parsed is None:
        return None
    return verify_token(token, secret_of(parsed[0]))
