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

Modules: ``client`` (the HTTP client, retries), ``sigv4`` (request signing), ``spec`` (the
JobSpec of ``submit``), ``render`` (tables, times, the ``show`` view), ``commands`` (every
subcommand but ``watch``), ``watch``, ``command_line`` (the parser and ``main``); ``errors``,
``constants`` and ``clock`` (time, replaced by the tests) beneath them.
"""

from cli.gpujobs.client import ApiClient
from cli.gpujobs.command_line import build_parser, main
from cli.gpujobs.constants import (
    AUTO_PRIORITY,
    ENDPOINT_ENV,
    NON_TERMINAL_STATES,
    PRIORITIES,
    TERMINAL_STATES,
)
from cli.gpujobs.errors import ApiError, CliError
from cli.gpujobs.render import format_job
from cli.gpujobs.sigv4 import needs_sigv4, region_from_url, sign_request
from cli.gpujobs.spec import build_spec, load_spec_file, normalize_priority

__all__ = [
    "AUTO_PRIORITY",
    "ENDPOINT_ENV",
    "NON_TERMINAL_STATES",
    "PRIORITIES",
    "TERMINAL_STATES",
    "ApiClient",
    "ApiError",
    "CliError",
    "build_parser",
    "build_spec",
    "format_job",
    "load_spec_file",
    "main",
    "needs_sigv4",
    "normalize_priority",
    "region_from_url",
    "sign_request",
]
