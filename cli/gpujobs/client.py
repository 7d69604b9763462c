"""The jobs API over urllib: URL building, signing, retries, JSON in and out."""

from __future__ import annotations

import getpass
import http.client
import json
import os
import random
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from cli.gpujobs import clock
from cli.gpujobs.constants import EXIT_SERVER
from cli.gpujobs.errors import ApiError, CliError
from cli.gpujobs.sigv4 import needs_sigv4, region_from_url, sign_request

USER_AGENT = "gpujobs-cli/0.1"
API_PREFIX = "/v1"

MAX_TRIES = 3
RETRY_BACKOFF_SECONDS = 0.5  # base of the exponential backoff between tries (with jitter)
MAX_RETRY_AFTER_SECONDS = 10.0
DEFAULT_TIMEOUT_SECONDS = 30.0
# The API's Date header has whole seconds: a smaller difference is rounding, not skew.
MIN_CLOCK_OFFSET_SECONDS = 2.0


class ApiClient:
    """The jobs API over urllib: URL building, signing, retries, JSON in and out."""

    def __init__(self, endpoint: str, *, region: str | None = None, profile: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS, credentials: Any = None,
                 local_user: str | None = None) -> None:
        parts = urllib.parse.urlsplit(endpoint.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise CliError(f"invalid endpoint {endpoint!r}: expected http(s)://host[:port][/stage]")
        base_path = parts.path.rstrip("/")
        # The jobs API lives under /v1. An endpoint that already ends in /v1 (the API Gateway
        # stage URL, e.g. https://abc.execute-api.us-east-1.amazonaws.com/v1) is used as is.
        if not base_path.endswith(API_PREFIX):
            base_path += API_PREFIX
        self.base_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, base_path, "", ""))
        self.signed = needs_sigv4(self.base_url)
        self.profile = profile
        self.timeout = timeout
        self._credentials = credentials
        self._region = region
        self.local_user = local_user
        #: the API's clock minus ours, from its Date header (0 while within rounding)
        self.clock_offset = 0.0

    # -- configuration resolved lazily (local mode never touches botocore)

    def _session(self) -> Any:
        import botocore.exceptions
        import botocore.session

        try:
            return botocore.session.Session(profile=self.profile)
        except botocore.exceptions.ProfileNotFound as exc:
            raise CliError(str(exc)) from exc

    @property
    def region(self) -> str:
        if self._region is None:
            region = (region_from_url(self.base_url) or os.environ.get("AWS_REGION")
                      or os.environ.get("AWS_DEFAULT_REGION"))
            if not region:
                import botocore.exceptions

                try:
                    region = self._session().get_config_variable("region")
                except botocore.exceptions.BotoCoreError as exc:
                    raise CliError(f"cannot determine the AWS region: {exc}") from exc
            if not region:
                raise CliError("cannot determine the AWS region: pass --region or set AWS_REGION")
            self._region = region
        return self._region

    @property
    def credentials(self) -> Any:
        if self._credentials is None:
            import botocore.exceptions

            try:
                creds = self._session().get_credentials()
            except botocore.exceptions.BotoCoreError as exc:
                raise CliError(f"cannot load AWS credentials: {exc}") from exc
            if creds is None:
                raise CliError("no AWS credentials found (configure a profile, pass --profile, "
                               "or set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
            self._credentials = creds
        return self._credentials

    # -- requests

    def url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        url = self.base_url + path
        params = {k: str(v) for k, v in (query or {}).items() if v is not None and v != ""}
        if params:
            # RFC 3986 encoding (%20, %2F) = the SigV4 canonical form, so the signature matches.
            url += "?" + urllib.parse.urlencode(sorted(params.items()), quote_via=urllib.parse.quote,
                                                safe="-_.~")
        return url

    def prepare(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, headers: Mapping[str, str] | None = None) -> urllib.request.Request:
        """Build (and sign, for AWS endpoints) one request; called again for every try."""
        url = self.url(path, query)
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")
        hdrs: dict[str, str] = {"Accept": "application/json"}
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        hdrs.update(headers or {})
        if self.signed:
            hdrs = sign_request(method, url, hdrs, data, self.credentials, self.region)
        else:
            hdrs["X-Local-User"] = self.local_user or _local_user()
        hdrs["User-Agent"] = USER_AGENT  # not signed (SigV4 ignores User-Agent)
        return urllib.request.Request(url, data=data, headers=hdrs, method=method.upper())  # noqa: S310

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Send with retries (connection errors, 429, 5xx); return the JSON object answered."""
        last_error: ApiError | None = None
        for attempt in range(1, MAX_TRIES + 1):
            req = self.prepare(method, path, query=query, body=body, headers=headers)
            retry_after: float | None = None
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 (http(s) only)
                    payload = resp.read()
                    headers = getattr(resp, "headers", None)
                    self._note_server_time(headers.get("Date") if headers is not None else None)
                    return _decode_json(payload, resp.status)
            except urllib.error.HTTPError as exc:
                payload = _read_quietly(exc)
                error = ApiError.from_response(exc.code, exc.reason, payload)
                if exc.code != 429 and exc.code < 500:
                    raise error from None
                last_error = error
                retry_after = _retry_after(exc.headers)
            except (OSError, http.client.HTTPException) as exc:  # URLError, resets, timeouts
                reason = getattr(exc, "reason", None) or exc
                last_error = ApiError(f"cannot reach {self.base_url}: {reason}", exit_code=EXIT_SERVER)
            if attempt < MAX_TRIES:
                backoff = RETRY_BACKOFF_SECONDS * (2 ** (attempt - 1)) * (1 + random.random() / 2)
                clock.sleep(max(backoff, retry_after or 0.0))
        assert last_error is not None
        raise last_error

    def _note_server_time(self, date: str | None) -> None:
        """Keep the API's clock: job times (submitted_at, history) are on it. The local
        playground's clock may run faster than the wall clock."""
        try:
            server = parsedate_to_datetime(date) if date else None
        except (TypeError, ValueError):
            server = None
        if server is None or server.tzinfo is None:
            return
        offset = (server - clock.utcnow()).total_seconds()
        self.clock_offset = offset if abs(offset) >= MIN_CLOCK_OFFSET_SECONDS else 0.0

    def server_now(self) -> datetime:
        """Now, on the API's clock."""
        return clock.utcnow() + timedelta(seconds=self.clock_offset)

    # -- the API

    def submit(self, spec: Mapping[str, Any], idempotency_key: str) -> dict[str, Any]:
        return self.request("POST", "/jobs", body=dict(spec), headers={"Idempotency-Key": idempotency_key})

    def get_job(self, job_id: str, *, ranks_from: int | None = None,
                ranks_limit: int | None = None) -> dict[str, Any]:
        """The job with a page of its ranks (the API's first 100 unless asked otherwise)."""
        return self.request("GET", f"/jobs/{_q(job_id)}",
                            query={"ranks_from": ranks_from, "ranks_limit": ranks_limit})

    def list_jobs(self, *, state: str | None = None, user: str | None = None, limit: int | None = None,
                  next_token: str | None = None) -> dict[str, Any]:
        return self.request("GET", "/jobs", query={"state": state, "user": user, "limit": limit,
                                                   "next_token": next_token})

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{_q(job_id)}/cancel")

    # Suspend and resume are idempotent on the server (a repeat answers changed=false), so
    # the retries of request() are safe for them as for cancel.
    def suspend(self, job_id: str) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{_q(job_id)}/suspend")

    def resume(self, job_id: str) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{_q(job_id)}/resume")

    def quotas(self, *, user: str | None = None, all_users: bool = False, limit: int | None = None,
               next_token: str | None = None) -> dict[str, Any]:
        return self.request("GET", "/quotas", query={"user": user, "all": "true" if all_users else None,
                                                     "limit": limit, "next_token": next_token})

    def events(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/jobs/{_q(job_id)}/events")

    def logs(self, job_id: str, *, rank: int | None = None, attempt: int | None = None,
             next_token: str | None = None) -> dict[str, Any]:
        return self.request("GET", f"/jobs/{_q(job_id)}/logs",
                            query={"rank": rank, "attempt": attempt, "next_token": next_token})


def _q(segment: str) -> str:
    return urllib.parse.quote(str(segment), safe="")


def _local_user() -> str:
    user = os.environ.get("USER")
    if user:
        return user
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers)
        return "unknown"


def _read_quietly(exc: urllib.error.HTTPError) -> bytes:
    try:
        return exc.read() or b""
    except Exception:
        return b""


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return min(float(value), MAX_RETRY_AFTER_SECONDS) if value is not None else None
    except ValueError:
        return None


def _decode_json(payload: bytes, status: int) -> dict[str, Any]:
    if not payload.strip():
        return {}
    try:
        doc = json.loads(payload)
    except ValueError:
        raise ApiError(f"HTTP {status}: the API answered something that is not JSON: {payload[:200]!r}",
                       exit_code=EXIT_SERVER, status=status) from None
    return doc if isinstance(doc, dict) else {"result": doc}
