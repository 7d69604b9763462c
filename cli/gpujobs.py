"""``gpujobs``: submit and follow multi-node GPU training jobs through the jobs REST API.

Subcommands: ``submit``, ``list``, ``show``, ``cancel``, ``suspend``, ``resume``, ``events``,
``logs``, ``watch``, ``quota``. See ``cli/README.md`` for examples.

Transport is stdlib ``urllib.request``. Requests to API Gateway endpoints (host ending in
``.amazonaws.com``) are signed with SigV4 (service ``execute-api``) using botocore
credentials; anything else (e.g. the local-mode server on ``http://127.0.0.1:8080``) is sent
unsigned with an ``X-Local-User`` header. Connection errors, 429 and 5xx are retried (3 tries
in all); ``submit`` is safe to retry because every attempt carries the same
``Idempotency-Key``.

Exit codes: 0 success; 1 ``watch`` saw the job end FAILED / USER_STOPPED / CANCELED;
2 usage, configuration or 4xx errors; 3 5xx or network errors; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import hashlib
import http.client
import json
import os
import random
import re
import shlex
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, TextIO

PROG = "gpujobs"
USER_AGENT = "gpujobs-cli/0.1"
ENDPOINT_ENV = "GPUJOBS_ENDPOINT"
SIGV4_SERVICE = "execute-api"
API_PREFIX = "/v1"

NON_TERMINAL_STATES = (
    "QUEUED", "PENDING_RESOURCES", "STARTING", "RUNNING", "PENDING_HEALTHCHECK",
    "PENDING_RESTART", "HELD", "NODE_LOST", "HUNG", "SUSPENDING", "SUSPENDED", "CANCELING",
)
TERMINAL_STATES = ("COMPLETE", "FAILED", "USER_STOPPED", "CANCELED")
FAILED_TERMINAL_STATES = frozenset(TERMINAL_STATES) - {"COMPLETE"}
PRIORITIES = ("LOW", "BELOW_NORMAL", "NORMAL", "ABOVE_NORMAL", "HIGH", "VERY_HIGH", "EXTREME_HIGH")
AUTO_PRIORITY = "AUTO"  # the server picks the highest level where the user's node quota has room

MAX_TRIES = 3
RETRY_BACKOFF_SECONDS = 0.5  # base of the exponential backoff between tries (with jitter)
MAX_RETRY_AFTER_SECONDS = 10.0
DEFAULT_TIMEOUT_SECONDS = 30.0
LOGS_POLL_SECONDS = 2.0
WATCH_POLL_SECONDS = 5.0
WATCH_MAX_CONSECUTIVE_ERRORS = 5
WATCH_FIRST_REASONS = 5  # transitions shown when watching begins (then every new one)
# The API's Date header has whole seconds: a smaller difference is rounding, not skew.
MIN_CLOCK_OFFSET_SECONDS = 2.0
MAX_PAGES = 10_000  # guard against a server that never stops paginating

EXIT_OK, EXIT_JOB_FAILED, EXIT_CLIENT, EXIT_SERVER, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_WATCH_TIMEOUT = 124  # as timeout(1): the job had not ended when `watch --timeout` ran out

# Indirections the tests replace (no real waiting, fixed clock).
_sleep: Callable[[float], None] = time.sleep
_monotonic: Callable[[], float] = time.monotonic


def _utcnow() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- errors


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


# --------------------------------------------------------------------------- SigV4


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


# --------------------------------------------------------------------------- client


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
                _sleep(max(backoff, retry_after or 0.0))
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
        offset = (server - _utcnow()).total_seconds()
        self.clock_offset = offset if abs(offset) >= MIN_CLOCK_OFFSET_SECONDS else 0.0

    def server_now(self) -> datetime:
        """Now, on the API's clock."""
        return _utcnow() + timedelta(seconds=self.clock_offset)

    # -- the API

    def submit(self, spec: Mapping[str, Any], idempotency_key: str) -> dict[str, Any]:
        return self.request("POST", "/jobs", body=dict(spec), headers={"Idempotency-Key": idempotency_key})

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/jobs/{_q(job_id)}")

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


# --------------------------------------------------------------------------- job specs


def _kv_pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--{what} expects KEY=VALUE, got {item!r}", field=what)
        out[key] = value
    return out


def _str_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _str_map(value: Any, field: str) -> dict[str, str]:
    """A {K: V} map from a dict, a list of "K=V" or a list of {"name", "value"} (ECS style)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): _str_value(v) for k, v in value.items()}
    if isinstance(value, list):
        out: dict[str, str] = {}
        for item in value:
            if isinstance(item, Mapping) and "name" in item:
                out[str(item["name"])] = _str_value(item.get("value"))
            elif isinstance(item, str) and "=" in item:
                k, _, v = item.partition("=")
                out[k] = v
            else:
                raise CliError(f"{field}: expected a map or a list of KEY=VALUE, got {item!r}", field=field)
        return out
    raise CliError(f"{field}: expected a map of KEY: VALUE", field=field)


def _command(value: Any, field: str = "command") -> list[str]:
    """A command list from a spec file: a list as is, a string shell-split."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list):
        return [_str_value(v) for v in value]
    raise CliError(f"{field}: expected a list of strings or a string", field=field)


def _command_flags(values: list[str]) -> list[str]:
    """``--command``: one argument per flag, or a single flag holding a shell-quoted string."""
    if len(values) == 1:
        return shlex.split(values[0])
    return list(values)


def normalize_priority(value: Any) -> int | str:
    if isinstance(value, bool):
        raise CliError(f"invalid priority {value!r}", field="priority")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    name = text.upper().replace("-", "_").replace(" ", "_")
    if name not in PRIORITIES and name != AUTO_PRIORITY:
        raise CliError(f"invalid priority {value!r}: an integer, one of {', '.join(PRIORITIES)}, "
                       f"or {AUTO_PRIORITY}", field="priority")
    return name


def load_spec_file(path: str) -> dict[str, Any]:
    """Read a JobSpec from YAML or JSON (``-`` = stdin)."""
    import yaml

    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not valid YAML/JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CliError(f"{path}: expected a mapping (a JobSpec), got {type(doc).__name__}")
    return doc


def build_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The JobSpec body: the spec file (if any), then the flags on top."""
    spec: dict[str, Any] = load_spec_file(args.file) if args.file else {}
    # Accept "task-definition" style keys and top-level command/environment in spec files.
    spec = {str(k).replace("-", "_"): v for k, v in spec.items()}
    overrides = dict(spec.pop("overrides", None) or {})
    for key in ("command", "environment"):
        if key in spec:
            overrides.setdefault(key, spec.pop(key))
    if "env" in spec:
        overrides.setdefault("environment", spec.pop("env"))

    for flag, key in (("name", "name"), ("task_definition", "task_definition"),
                      ("container_name", "container_name"), ("nnodes", "nnodes"),
                      ("gpus_per_node", "gpus_per_node"),
                      ("max_recovery_attempts", "max_recovery_attempts"),
                      ("max_infra_recoveries", "max_infra_recoveries"),
                      ("max_app_restarts", "max_app_restarts"),
                      ("suspend_grace", "suspend_grace_seconds")):
        value = getattr(args, flag)
        if value is not None:
            spec[key] = value
    if args.priority is not None:
        spec["priority"] = args.priority
    if "command" in overrides:
        overrides["command"] = _command(overrides["command"], "overrides.command")
    if args.command:
        overrides["command"] = _command_flags(args.command)
    env = _str_map(overrides.get("environment"), "overrides.environment")
    env.update(_kv_pairs(args.env, "env"))
    if env or "environment" in overrides:
        overrides["environment"] = env
    labels = _str_map(spec.get("labels"), "labels")
    labels.update(_kv_pairs(args.label, "label"))
    if labels or "labels" in spec:
        spec["labels"] = labels
    if overrides:
        spec["overrides"] = overrides
    if "priority" in spec:
        spec["priority"] = normalize_priority(spec["priority"])
    for key in ("nnodes", "gpus_per_node", "max_recovery_attempts", "max_infra_recoveries",
                "max_app_restarts", "suspend_grace_seconds"):
        if key in spec and not isinstance(spec[key], int):
            try:
                spec[key] = int(spec[key])
            except (TypeError, ValueError):
                raise CliError(f"{key} must be an integer, got {spec[key]!r}", field=key) from None
    for key in ("name", "task_definition"):
        if not spec.get(key):
            flag = "--" + key.replace("_", "-")
            raise CliError(f"missing {key}: pass {flag} or set it in the spec file (-f)", field=key)
    return spec


# --------------------------------------------------------------------------- formatting


def _out() -> TextIO:
    return sys.stdout


def _print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, sort_keys=False, default=str), file=_out())


def _parse_time(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if value <= 0:
            return None  # "not set"
        seconds = value / 1000.0 if value > 1e11 else float(value)  # epoch ms or s
        return datetime.fromtimestamp(seconds, UTC)
    text = str(value).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return _parse_time(float(text))
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _fmt_time(value: Any) -> str:
    parsed = _parse_time(value)
    if parsed is None:
        return "" if value is None else str(value)
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    return (f"{days}d " if days else "") + f"{hours:d}:{minutes:02d}:{secs:02d}"


def _short_arn(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.rsplit("/", 1)[-1] if text.startswith("arn:") else text


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value).replace("\n", " ")


def _table(headers: list[str], rows: list[list[Any]], indent: str = "") -> list[str]:
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        padded = [v.ljust(widths[i]) if i < len(values) - 1 else v for i, v in enumerate(values)]
        return (indent + "  ".join(padded)).rstrip()

    return [line(headers)] + [line(r) for r in cells]


def _nodes(job: Mapping[str, Any]) -> str:
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    nnodes = job.get("nnodes", spec.get("nnodes"))
    gpus = job.get("gpus_per_node", spec.get("gpus_per_node"))
    if nnodes is None:
        return "-"
    return f"{nnodes}x{gpus}" if gpus is not None else str(nnodes)


def _ranks(job: Mapping[str, Any]) -> tuple[int, int]:
    ranks = job.get("ranks") if isinstance(job.get("ranks"), list) else []
    running = sum(1 for r in ranks if isinstance(r, dict) and str(r.get("state", "")).upper() == "RUNNING")
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    total = job.get("nnodes") or spec.get("nnodes") or len(ranks)
    try:
        total = int(total)
    except (TypeError, ValueError):
        total = len(ranks)
    return running, max(total, len(ranks))


_PRIORITY_NAMES = {0: "LOW", 5: "BELOW_NORMAL", 10: "NORMAL", 20: "ABOVE_NORMAL", 30: "HIGH",
                   40: "VERY_HIGH", 50: "EXTREME_HIGH"}


def _priority(job: Mapping[str, Any]) -> Any:
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    value = job.get("priority", spec.get("priority"))
    name = job.get("priority_name") or (_PRIORITY_NAMES.get(value) if isinstance(value, int) else None)
    if name and str(name) != str(value) and value is not None:
        return f"{name} ({value})"
    return value


def _priority_detail(job: Mapping[str, Any]) -> Any:
    """``show``'s priority: the level, and how it came to be (AUTO at submit, a demotion)."""
    shown = _priority(job)
    notes = []
    if str(job.get("priority_requested") or "").upper() == AUTO_PRIORITY:
        notes.append(f"chosen by {AUTO_PRIORITY} at submit")
    demoted = job.get("demoted_from")
    if demoted is not None and demoted != "":
        name = _PRIORITY_NAMES.get(demoted) if isinstance(demoted, int) else None
        notes.append(f"demoted from {name} ({demoted})" if name else f"demoted from {demoted}")
    if shown is None or not notes:
        return shown
    return f"{shown}, {', '.join(notes)}"


def _state_label(job: Mapping[str, Any]) -> str:
    """The state, marked ``(held)`` for a job suspended by its user: it waits for ``resume``."""
    state = str(job.get("state", "?"))
    return f"{state} (held)" if job.get("held") else state


def _suspension_lines(job: Mapping[str, Any]) -> list[str]:
    """The suspension block of ``show``: the current one, or the last one once resumed."""
    raw = job.get("suspend")
    if not isinstance(raw, dict) or not raw:
        return []
    state = str(job.get("state", "")).upper()
    current = state in ("SUSPENDING", "SUSPENDED")
    kind = str(raw.get("kind") or "-")
    by_text = ", ".join(f"{what} {raw[key]}" for what, key in (("job", "by_job"), ("user", "by_user"))
                        if raw.get(key))
    deadline = _fmt_time(raw.get("deadline_at")) or None
    grace = raw.get("grace_seconds")
    if deadline and grace:
        deadline = f"{deadline} (grace {grace} s)"
    held = None
    if state == "SUSPENDED":
        held = (f"yes: waits for `{PROG} resume {job.get('job_id', 'ID')}`" if job.get("held")
                else "no: queued again at its original position")
    elif state == "SUSPENDING":
        held = "yes, once its ranks stopped" if raw.get("hold") else "no: queued again once its ranks stopped"
    stopped = raw.get("stop_reason") or None
    if stopped and raw.get("stop_requested_at"):
        stopped = f"{_fmt_time(raw.get('stop_requested_at'))}: {stopped}"
    fields: list[tuple[str, Any]] = [
        ("Kind", kind + (f" (by {by_text})" if by_text else "")),
        ("Reason", raw.get("reason") or None),
        ("Requested", _fmt_time(raw.get("requested_at")) or None),
        # A past suspension's deadline says nothing any more; the current one's is the forced stop.
        ("Deadline", deadline if current else None),
        ("Stopped", stopped),
        ("Held", held),
    ]
    title = "Suspension:" if current else "Last suspension:"
    return ["", title] + [f"  {label + ':':<10} {_cell(value)}" for label, value in fields
                          if value not in (None, "")]


def _rank_table(ranks: list[dict[str, Any]]) -> list[str]:
    columns: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("RANK", lambda r: r.get("rank")),
        ("STATE", lambda r: r.get("state")),
        ("TASK", lambda r: _short_arn(r.get("task_arn"))),
        ("CONTAINER INSTANCE",
         lambda r: _short_arn(r.get("container_instance") or r.get("container_instance_id"))),
        ("EC2 INSTANCE", lambda r: r.get("ec2_instance_id")),
        ("LAST HEARTBEAT", lambda r: _fmt_time(r.get("last_heartbeat_at"))),
        ("EXIT", lambda r: r.get("exit_code")),
        ("STOP REASON", lambda r: r.get("stop_reason")),
    ]
    always = {"RANK", "STATE", "TASK", "CONTAINER INSTANCE", "LAST HEARTBEAT"}
    values = [[get(r) for _, get in columns] for r in ranks]
    keep = [i for i, (title, _) in enumerate(columns)
            if title in always or any(row[i] not in (None, "") for row in values)]
    rows = [[row[i] if row[i] not in ("",) else None for i in keep] for row in values]
    return _table([columns[i][0] for i in keep], rows, indent="  ")


def format_job(job: Mapping[str, Any]) -> list[str]:
    """The human ``show`` view; tolerant of missing fields and of extra ones."""
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    overrides = spec.get("overrides") if isinstance(spec.get("overrides"), dict) else {}
    name = job.get("name") or spec.get("name")
    lines = [f"Job:        {job.get('job_id', '-')}" + (f"  ({name})" if name else "")]
    running, total = _ranks(job)
    nodes = _nodes(job)
    max_recoveries = job.get("max_recovery_attempts", spec.get("max_recovery_attempts"))
    recoveries = None
    if max_recoveries is not None:
        used = job.get("recoveries_used")
        recoveries = f"{used}/{max_recoveries} used" if used is not None else f"max {max_recoveries}"
    labels = spec.get("labels") if isinstance(spec.get("labels"), dict) else {}
    counts = [int(job.get("suspend_count") or 0), int(job.get("resume_count") or 0)]
    state = job.get("state")
    if state is not None and job.get("held"):
        state = f"{state}, held until resumed"
    fields: list[tuple[str, Any]] = [
        ("State", state),
        ("Waiting", job.get("wait_reason") or None),
        ("User", job.get("user")),
        ("Quota user", job.get("quota_user") or None),
        ("Priority", _priority_detail(job)),
        ("Submitted", _fmt_time(job.get("submitted_at")) or None),
        ("Task def", spec.get("task_definition")),
        ("Nodes", f"{nodes} GPUs" if nodes != "-" else None),
        ("Attempt", job.get("attempt")),
        ("Recoveries", recoveries),
        ("Suspended", f"{counts[0]} time(s), resumed {counts[1]}" if any(counts) else None),
        ("Ranks", f"{running}/{total} running" if total else None),
        ("Command", " ".join(shlex.quote(str(c)) for c in overrides.get("command") or []) or None),
        ("Labels", ", ".join(f"{k}={v}" for k, v in labels.items()) or None),
        ("Last error", job.get("last_error")),
    ]
    lines += [f"{label + ':':<11} {_cell(value)}" for label, value in fields if value not in (None, "")]
    lines += _suspension_lines(job)
    ranks = [r for r in job.get("ranks") or [] if isinstance(r, dict)]
    if ranks:
        lines += ["", "Ranks:", *_rank_table(ranks)]
    attempts = [a for a in job.get("attempts") or [] if isinstance(a, dict)]
    if attempts:
        lines += ["", "Attempts:"]
        lines += _table(["ATTEMPT", "STARTED", "ENDED", "OUTCOME", "FAILURE", "REASON"],
                        [[a.get("attempt"), _fmt_time(a.get("started_at")) or None,
                          _fmt_time(a.get("ended_at")) or None, a.get("outcome") or None,
                          a.get("failure_kind") or None, a.get("reason") or None] for a in attempts],
                        indent="  ")
    return lines


# --------------------------------------------------------------------------- commands


def _json_mode(args: argparse.Namespace) -> bool:
    return bool(args.json or getattr(args, "sub_json", False))


def cmd_submit(client: ApiClient, args: argparse.Namespace) -> int:
    spec = build_spec(args)
    if args.dry_run:
        _print_json(spec)
        return EXIT_OK
    job = client.submit(spec, args.idempotency_key or str(uuid.uuid4()))
    if _json_mode(args):
        _print_json(job)
    else:
        print(job.get("job_id", ""), file=_out())
    return EXIT_OK


def _iter_job_pages(client: ApiClient, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    token = args.next_token
    seen: set[str] = set()
    for _ in range(MAX_PAGES):
        page = client.list_jobs(state=args.state.upper() if args.state else None, user=args.user,
                                limit=args.limit, next_token=token)
        yield page
        token = page.get("next_token")
        if not args.all or not token or token in seen:
            return
        seen.add(token)


def cmd_list(client: ApiClient, args: argparse.Namespace) -> int:
    jobs: list[dict[str, Any]] = []
    next_token = None
    for page in _iter_job_pages(client, args):
        jobs += [j for j in page.get("jobs") or [] if isinstance(j, dict)]
        next_token = page.get("next_token")
    if _json_mode(args):
        _print_json({"jobs": jobs, "next_token": next_token})
        return EXIT_OK
    if not jobs:
        print("no jobs", file=sys.stderr)
    else:
        rows = [[j.get("job_id"), j.get("name"), j.get("state"), j.get("user"),
                 j.get("priority_name") or j.get("priority"),
                 _nodes(j), j.get("attempt"), _fmt_time(j.get("submitted_at")) or None] for j in jobs]
        for line in _table(["JOB ID", "NAME", "STATE", "USER", "PRIORITY", "NODES", "ATTEMPT", "SUBMITTED"],
                           rows):
            print(line, file=_out())
    if next_token and not args.all:
        print(f"(more jobs: --next-token {next_token} or --all)", file=sys.stderr)
    return EXIT_OK


def cmd_show(client: ApiClient, args: argparse.Namespace) -> int:
    job = client.get_job(args.job_id)
    if _json_mode(args):
        _print_json(job)
    else:
        print("\n".join(format_job(job)), file=_out())
    return EXIT_OK


def cmd_cancel(client: ApiClient, args: argparse.Namespace) -> int:
    result = client.cancel(args.job_id)
    if _json_mode(args):
        _print_json(result)
    else:
        print(f"{result.get('job_id', args.job_id)}: {result.get('state', 'CANCELING')}", file=_out())
    return EXIT_OK


def _suspend_outcome(result: Mapping[str, Any], job_id: str, action: str) -> str:
    """One line, ``ID: STATE`` first (like ``cancel``), then what happens next."""
    job_id = str(result.get("job_id") or job_id)
    state = str(result.get("state") or "?")
    notes: list[str] = []
    if action == "suspend":
        if state == "SUSPENDING" and result.get("deadline_at"):
            notes.append("rank 0 is told to checkpoint and call go_suspend(); ranks stopped by "
                         f"{_fmt_time(result.get('deadline_at'))} at the latest")
        if result.get("held", True):
            notes.append(f"held until `{PROG} resume {job_id}`")
    elif state == "SUSPENDING":
        notes.append("queued again once its ranks stopped")
    else:
        notes.append("queued at its original position: it starts when nodes are free")
    if result.get("changed") is False:
        notes.append("it already was")
    return f"{job_id}: {state}" + (f" ({'; '.join(notes)})" if notes else "")


def cmd_suspend(client: ApiClient, args: argparse.Namespace) -> int:
    result = client.suspend(args.job_id)
    if _json_mode(args):
        _print_json(result)
    else:
        print(_suspend_outcome(result, args.job_id, "suspend"), file=_out())
    return EXIT_OK


def cmd_resume(client: ApiClient, args: argparse.Namespace) -> int:
    result = client.resume(args.job_id)
    if _json_mode(args):
        _print_json(result)
    else:
        print(_suspend_outcome(result, args.job_id, "resume"), file=_out())
    return EXIT_OK


def _quota_cells(row: Mapping[str, Any]) -> list[Any]:
    """PRIORITY, LIMIT, SOURCE, IN USE, ROOM of one quota row (no limit: "unlimited")."""
    limit = row.get("max_nodes")
    room = row.get("room")
    return [row.get("priority_name") or row.get("priority"), "unlimited" if limit is None else limit,
            row.get("source"), row.get("used_nodes", 0), "-" if room is None else room]


_QUOTA_HEADERS = ["PRIORITY", "LIMIT", "SOURCE", "IN USE", "ROOM"]


def cmd_quota(client: ApiClient, args: argparse.Namespace) -> int:
    if args.all:
        rows: list[dict[str, Any]] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = client.quotas(all_users=True, next_token=token)
            rows += [r for r in page.get("quotas") or [] if isinstance(r, dict)]
            token = page.get("next_token") or None
            if not token:
                break
        if _json_mode(args):
            _print_json({"quotas": rows, "next_token": None})
        elif not rows:
            print("no quota set and no node in use at any level (the deployment's defaults apply)",
                  file=sys.stderr)
        else:
            for line in _table(["USER", *_QUOTA_HEADERS], [[r.get("user"), *_quota_cells(r)] for r in rows]):
                print(line, file=_out())
        return EXIT_OK
    doc = client.quotas(user=args.user)
    if _json_mode(args):
        _print_json(doc)
        return EXIT_OK
    levels = [r for r in doc.get("quotas") or [] if isinstance(r, dict)]
    print(f"User: {doc.get('user', args.user or '-')}", file=_out())
    for line in _table(_QUOTA_HEADERS, [_quota_cells(r) for r in levels]):
        print(line, file=_out())
    return EXIT_OK


def cmd_events(client: ApiClient, args: argparse.Namespace) -> int:
    doc = client.events(args.job_id)
    if _json_mode(args):
        _print_json(doc)
        return EXIT_OK
    events = [e for e in doc.get("events") or [] if isinstance(e, dict)]
    if not events:
        print("no events", file=sys.stderr)
        return EXIT_OK
    rows = [[_fmt_time(e.get("at")) or None, e.get("from"), e.get("to"), e.get("actor"), e.get("reason")]
            for e in events]
    for line in _table(["AT", "FROM", "TO", "ACTOR", "REASON"], rows):
        print(line, file=_out())
    return EXIT_OK


def _print_log_event(event: Mapping[str, Any], json_mode: bool) -> None:
    if json_mode:
        print(json.dumps(event, separators=(",", ":"), default=str), file=_out())
    else:
        message = str(event.get("message", "")).rstrip("\n")
        stamp = _fmt_time(event.get("timestamp"))
        print(f"{stamp} {message}" if stamp else message, file=_out())
    _out().flush()


def cmd_logs(client: ApiClient, args: argparse.Namespace) -> int:
    """Print log events page by page; with --follow keep polling until the job is terminal.

    A page without events means "caught up". A null ``next_token`` means "no more for now":
    the next poll reuses the last token and skips events already printed for it.
    """
    json_mode = _json_mode(args)
    token: str | None = args.next_token
    printed: set[tuple[str, str]] = set()  # events printed since the token last changed
    terminal_seen = False
    while True:
        page = client.logs(args.job_id, rank=args.rank, attempt=args.attempt, next_token=token)
        fresh = 0
        for event in page.get("events") or []:
            if not isinstance(event, dict):
                continue
            key = (str(event.get("timestamp")), str(event.get("message")))
            if key in printed:
                continue
            printed.add(key)
            _print_log_event(event, json_mode)
            fresh += 1
        new_token = page.get("next_token") or None
        advanced = new_token is not None and new_token != token
        if advanced:
            token, printed = new_token, set()
        if not args.follow:
            if fresh and advanced:
                continue
            return EXIT_OK
        if fresh:
            continue  # more may be ready: drain without waiting
        # Caught up. Stop once a fetch made after seeing a terminal state found nothing new.
        if terminal_seen:
            return EXIT_OK
        state = str(client.get_job(args.job_id).get("state", "")).upper()
        if state in TERMINAL_STATES:
            terminal_seen = True
            continue
        _sleep(args.interval)


# Green: working; red: a fault; magenta: stopped by a user; cyan/blue: paused by time sharing
# (not a failure: the job comes back); yellow (the default): waiting or being recovered.
_COLORS = {
    "COMPLETE": "32", "RUNNING": "32", "FAILED": "31", "NODE_LOST": "31", "HUNG": "31",
    "USER_STOPPED": "35", "CANCELED": "35", "CANCELING": "35", "SUSPENDING": "36", "SUSPENDED": "34",
}


def _colored(state: str, enabled: bool) -> str:
    if not enabled:
        return state
    color = _COLORS.get(state.split(" ", 1)[0], "33")  # "SUSPENDED (held)" is colored as SUSPENDED
    return f"\x1b[1;{color}m{state}\x1b[0m"


class _Watcher:
    """Renders job snapshots: one line per change (pipes) or a live line redrawn in place (TTY)."""

    SPINNER = "|/-\\"

    def __init__(self, stream: TextIO, tty: bool, started: float,
                 now: Callable[[], datetime] | None = None) -> None:
        self.stream = stream
        self.tty = tty
        self.color = tty and not os.environ.get("NO_COLOR")
        self.started = started
        self.now = now or _utcnow  # the API's clock: job times are on it
        self.last_key: tuple[Any, ...] | None = None
        self.last_label: str | None = None
        self.frame = 0
        self.live_shown = False
        self.finished = False

    def _elapsed(self, job: Mapping[str, Any]) -> str:
        """Since submission (or since watching began); frozen at ``updated_at`` once terminal."""
        submitted = _parse_time(job.get("submitted_at"))
        if submitted is None:
            return _fmt_duration(_monotonic() - self.started)
        end = self.now()
        if str(job.get("state", "")).upper() in TERMINAL_STATES:
            end = _parse_time(job.get("updated_at")) or end
        return _fmt_duration((end - submitted).total_seconds())

    def _change_line(self, job: Mapping[str, Any], previous: str | None) -> str:
        state = str(job.get("state", "?"))
        running, total = _ranks(job)
        shown = _colored(_state_label(job), self.color)
        transition = f"{previous} -> {shown}" if previous else shown
        parts = [_fmt_time(self.now().isoformat()), str(job.get("job_id", "")), transition,
                 f"attempt={job.get('attempt', '-')}", f"ranks={running}/{total}",
                 f"elapsed={self._elapsed(job)}"]
        if state in FAILED_TERMINAL_STATES and job.get("last_error"):
            parts.append(f"error={_cell(job.get('last_error'))}")
        suspend = job.get("suspend") if isinstance(job.get("suspend"), dict) else {}
        if state in ("SUSPENDING", "SUSPENDED") and suspend:
            parts.append(f"suspend={suspend.get('kind', '?')}")
            if suspend.get("by_job"):
                parts.append(f"by={suspend['by_job']}")
            if state == "SUSPENDING" and suspend.get("deadline_at"):
                parts.append(f"deadline={_fmt_time(suspend.get('deadline_at'))}")
        return "  ".join(parts)

    def _live_line(self, job: Mapping[str, Any]) -> str:
        state = str(job.get("state", "?"))
        running, total = _ranks(job)
        width = 20
        filled = round(width * running / total) if total else 0
        bar = "#" * filled + "." * (width - filled)
        spin = self.SPINNER[self.frame % len(self.SPINNER)] if state not in TERMINAL_STATES else " "
        self.frame += 1
        line = (f"{spin} {job.get('job_id', '')}  {_colored(_state_label(job), self.color)}  "
                f"attempt {job.get('attempt', '-')}  ranks [{bar}] {running}/{total} running  "
                f"elapsed {self._elapsed(job)}")
        waiting = str(job.get("wait_reason") or "")
        if waiting:  # why a queued (or suspended, queued again) job does not start yet
            line += f"  waiting: {waiting[:60] + '...' if len(waiting) > 63 else waiting}"
        return line

    @staticmethod
    def key(job: Mapping[str, Any]) -> tuple[Any, ...]:
        # held is part of the key: resuming a held job leaves it SUSPENDED, but queued again.
        return job.get("state"), job.get("attempt"), bool(job.get("held"))

    def changed(self, job: Mapping[str, Any]) -> bool:
        return self.key(job) != self.last_key

    def update(self, job: Mapping[str, Any], reasons: list[str] | None = None) -> None:
        """Show ``job``; on a change, its line and then ``reasons`` (the transitions since
        the last change, each with why it happened)."""
        key = self.key(job)
        changed = key != self.last_key
        previous = self.last_label
        self.last_key = key
        self.last_label = _state_label(job)
        why = "".join(f"    {reason}\n" for reason in reasons or ()) if changed else ""
        if not self.tty:
            if changed:
                print(self._change_line(job, previous) + "\n" + why, end="", file=self.stream, flush=True)
            return
        out = "\r\x1b[2K"  # back to column 0, clear the live line
        if changed:
            out += self._change_line(job, previous) + "\n" + why
        out += self._live_line(job)
        self.stream.write(out)
        self.stream.flush()
        self.live_shown = True

    def warn(self, message: str) -> None:
        if self.tty and self.live_shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self.live_shown = False
        print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)

    def start(self) -> None:
        if self.tty:
            self.stream.write("\x1b[?25l")  # hide the cursor while redrawing

    def finish(self) -> None:
        """End the live line and show the cursor again (once: a timeout ends it early)."""
        if self.tty and not self.finished:
            self.stream.write(("\n" if self.live_shown else "") + "\x1b[?25h")
            self.stream.flush()
        self.finished = True


class _Reasons:
    """The job's transitions not shown yet, as ``HH:MM:SS STATE: reason`` (the events
    route): what happened between two polls (a health check, a reboot, a restart)."""

    def __init__(self, client: ApiClient, job_id: str) -> None:
        self.client = client
        self.job_id = job_id
        self.shown: int | None = None

    def new(self) -> list[str]:
        try:
            events = [e for e in self.client.events(self.job_id).get("events") or [] if isinstance(e, dict)]
        except ApiError:  # only an aid: the state line says what matters
            return []
        start = max(0, len(events) - WATCH_FIRST_REASONS) if self.shown is None else self.shown
        self.shown = len(events)
        out = []
        for event in events[start:]:
            at = _parse_time(event.get("at"))
            stamp = at.strftime("%H:%M:%S") if at else "--:--:--"
            out.append(f"{stamp} {event.get('to', '?')}: {_cell(event.get('reason'))}")
        return out


def cmd_watch(client: ApiClient, args: argparse.Namespace) -> int:
    stream = _out()
    tty = bool(getattr(stream, "isatty", lambda: False)()) and not _json_mode(args)
    started = _monotonic()
    watcher = _Watcher(stream, tty, started, now=client.server_now)
    errors = 0
    reasons = _Reasons(client, args.job_id)
    watcher.start()
    try:
        while True:
            try:
                job = client.get_job(args.job_id)
                errors = 0
            except ApiError as exc:
                if exc.exit_code != EXIT_SERVER:
                    raise
                errors += 1
                if errors >= WATCH_MAX_CONSECUTIVE_ERRORS:
                    raise
                watcher.warn(f"{exc.message} (will keep trying)")
                _sleep(args.interval)
                continue
            if _json_mode(args):
                key = (job.get("state"), job.get("attempt"), bool(job.get("held")))
                if key != watcher.last_key:
                    print(json.dumps(job, separators=(",", ":"), default=str), file=stream, flush=True)
                    watcher.last_key = key
            else:
                watcher.update(job, reasons.new() if watcher.changed(job) else None)
            state = str(job.get("state", "")).upper()
            if state in TERMINAL_STATES:
                return EXIT_OK if state == "COMPLETE" else EXIT_JOB_FAILED
            if args.watch_timeout is not None and _monotonic() - started >= args.watch_timeout:
                watcher.finish()
                print(f"{PROG}: watch: {args.job_id} is still {state or '?'} after {args.watch_timeout:g} s "
                      "(--timeout); it goes on without being watched", file=sys.stderr)
                return EXIT_WATCH_TIMEOUT
            _sleep(args.interval)
    finally:
        watcher.finish()


# --------------------------------------------------------------------------- CLI


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Submit and follow multi-node GPU training jobs on Amazon ECS.",
        epilog=f"Endpoint: --endpoint or ${ENDPOINT_ENV}. Exit codes: 0 ok, 1 watched job failed, "
               "2 usage/4xx, 3 5xx/network.",
    )
    parser.add_argument("--endpoint", default=None,
                        help=f"API base URL (default: ${ENDPOINT_ENV}), e.g. "
                             "https://abc.execute-api.us-east-1.amazonaws.com/v1 or http://127.0.0.1:8080")
    parser.add_argument("--region", default=None,
                        help="SigV4 signing region (default: from the endpoint host, else $AWS_REGION)")
    parser.add_argument("--profile", default=None, help="AWS profile for credentials (default: $AWS_PROFILE)")
    parser.add_argument("--timeout", type=_positive_float, default=DEFAULT_TIMEOUT_SECONDS,
                        help="HTTP timeout per try, seconds (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print raw JSON")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND")
    sub.required = True

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", dest="sub_json", action="store_true", help="print raw JSON")
        return p

    p = add("submit", "submit a job from a spec file and/or flags; prints the job id")
    p.add_argument("-f", "--file", help="JobSpec file, YAML or JSON ('-' = stdin); flags override it")
    p.add_argument("--name")
    p.add_argument("--task-definition", help="family:revision or ARN")
    p.add_argument("--container-name", help="container to override (default: the server's choice)")
    p.add_argument("--nnodes", type=_positive_int)
    p.add_argument("--gpus-per-node", type=_positive_int)
    p.add_argument("--priority", help=f"an integer, one of {', '.join(PRIORITIES)}, or {AUTO_PRIORITY} "
                                      "(the highest level where your node quota has room)")
    p.add_argument("--command", action="append", metavar="ARG",
                   help="command override: repeat once per argument, or one shell-quoted string")
    p.add_argument("--env", action="append", metavar="K=V", help="environment variable (repeatable)")
    p.add_argument("--max-recovery-attempts", type=int, help="older name of --max-infra-recoveries")
    p.add_argument("--max-infra-recoveries", type=int,
                   help="node faults fixed by a reboot or a move to healthy nodes (default 3)")
    p.add_argument("--max-app-restarts", type=int,
                   help="restarts after an application error (default 0: the job fails)")
    p.add_argument("--suspend-grace", type=_positive_int, metavar="SECONDS",
                   help="seconds rank 0 has to checkpoint and call go_suspend() once told to suspend "
                        "(default: the deployment's, 60)")
    p.add_argument("--label", action="append", metavar="K=V", help="label (repeatable)")
    p.add_argument("--idempotency-key", help="Idempotency-Key header (default: a fresh UUID4)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the JobSpec that would be sent; send nothing")
    p.set_defaults(func=cmd_submit)

    p = add("list", "list jobs, newest first")
    p.add_argument("--state", help="only jobs in this state")
    p.add_argument("--user", help="only jobs of this user")
    p.add_argument("--limit", type=_positive_int, help="page size")
    p.add_argument("--all", action="store_true", help="follow next_token through every page")
    p.add_argument("--next-token", help="start from this page token")
    p.set_defaults(func=cmd_list)

    p = add("show", "show one job: state, ranks, attempts")
    p.add_argument("job_id", metavar="ID")
    p.set_defaults(func=cmd_show)

    p = add("cancel", "cancel a job")
    p.add_argument("job_id", metavar="ID")
    p.set_defaults(func=cmd_cancel)

    p = add("suspend", "suspend a job gracefully (rank 0 checkpoints first); held until resumed")
    p.add_argument("job_id", metavar="ID")
    p.set_defaults(func=cmd_suspend)

    p = add("resume", "put a suspended job back in the queue at its original position")
    p.add_argument("job_id", metavar="ID")
    p.set_defaults(func=cmd_resume)

    p = add("quota", "your node quota at every priority level: limit, nodes in use, room")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--user", help="another user's quota (admins): an IAM ARN or the user name shown here")
    who.add_argument("--all", action="store_true", help="every quota set, and every usage (admins)")
    p.set_defaults(func=cmd_quota)

    p = add("events", "a job's state transitions")
    p.add_argument("job_id", metavar="ID")
    p.set_defaults(func=cmd_events)

    p = add("logs", "a job's training logs")
    p.add_argument("job_id", metavar="ID")
    p.add_argument("--rank", type=int, help="only this rank (default: the server's choice)")
    p.add_argument("--attempt", type=int, help="only this attempt (default: the current one)")
    p.add_argument("-F", "--follow", action="store_true", help="keep polling until the job is terminal")
    p.add_argument("--next-token", help="start from this token")
    p.add_argument("--interval", type=_positive_float, default=LOGS_POLL_SECONDS,
                   help="poll interval with --follow, seconds (default: %(default)s)")
    p.set_defaults(func=cmd_logs)

    p = add("watch", "follow a job's state until it ends (exit 0 COMPLETE, 1 FAILED/USER_STOPPED/CANCELED)")
    p.add_argument("job_id", metavar="ID")
    p.add_argument("--interval", type=_positive_float, default=WATCH_POLL_SECONDS,
                   help="poll interval, seconds (default: %(default)s)")
    # Its own dest: the global --timeout is the HTTP timeout per try.
    p.add_argument("--timeout", dest="watch_timeout", type=_positive_float, metavar="SECONDS",
                   help=f"give up after this many seconds if the job has not ended "
                        f"(exit {EXIT_WATCH_TIMEOUT}; default: wait until it ends)")
    p.set_defaults(func=cmd_watch)
    return parser


def _report(exc: CliError) -> None:
    message = exc.message + (f" (field: {exc.field})" if exc.field else "")
    print(f"{PROG}: error: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_CLIENT
    try:
        client: ApiClient | None = None
        if not (args.command_name == "submit" and args.dry_run):
            endpoint = args.endpoint or os.environ.get(ENDPOINT_ENV)
            if not endpoint:
                raise CliError(f"no endpoint: pass --endpoint or set {ENDPOINT_ENV}")
            client = ApiClient(endpoint, region=args.region, timeout=args.timeout,
                               profile=args.profile or os.environ.get("AWS_PROFILE") or None)
        return int(args.func(client, args))
    except CliError as exc:
        _report(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `gpujobs logs ID | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (silence the flush at exit)
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
