"""The REST APIs' routes and API Gateway's own answers: one source for infra (the stage's
resources, methods and gateway responses), the authorizers and the local API server.

REST API (one API Gateway stage): the methods each route has. Anything else is answered by
API Gateway itself (403 MISSING_AUTHENTICATION_TOKEN), as local mode does too.
"""

from __future__ import annotations

NODE_API_ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "v1/report_tasks"),
    ("POST", "v1/report_gpu"),
)
JOBS_API_ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "v1/jobs"),
    ("GET", "v1/jobs"),
    ("GET", "v1/jobs/{job_id}"),
    ("POST", "v1/jobs/{job_id}/cancel"),
    ("POST", "v1/jobs/{job_id}/suspend"),
    ("POST", "v1/jobs/{job_id}/resume"),
    ("GET", "v1/jobs/{job_id}/events"),
    ("GET", "v1/jobs/{job_id}/logs"),
    ("GET", "v1/quotas"),
    ("PUT", "v1/quotas"),
    ("DELETE", "v1/quotas"),
    ("GET", "swagger"),
)
# The job-control routes training code calls (gpu_recovery_client: receive_suspend_command,
# go_suspend), authorized by the per-rank control token the launcher puts in the task's
# environment (a TOKEN authorizer; no AWS credentials needed in the container).
CONTROL_API_ROUTES: tuple[tuple[str, str], ...] = (
    ("GET", "v1/control"),
    ("POST", "v1/control/suspend"),
    ("POST", "v1/control/checkpoint"),
    ("GET", "v1/control/preflight"),
    ("POST", "v1/control/preflight"),
)
# API Gateway's own answers (gateway responses), in the APIs' error shape
# {"error": <response type>, "message": ...}: infra configures them, local mode sends them.
GATEWAY_ERRORS: dict[str, tuple[int, str]] = {
    "UNAUTHORIZED": (401, "missing, malformed, unknown or revoked token (node or job-control token)"),
    "ACCESS_DENIED": (403, "token refused (wrong secret, or not valid for this route)"),
    "MISSING_AUTHENTICATION_TOKEN": (403, "no such route or method, or the request is not signed "
                                          "(SigV4)"),
    "REQUEST_TOO_LARGE": (413, "request body over API Gateway's 10 MB limit"),
    "THROTTLED": (429, "too many requests: retry with exponential backoff"),
}
# The node authorizer's identity validation expression (API Gateway rejects a header
# that does not match with 401, without invoking the authorizer).
NODE_TOKEN_HEADER_PATTERN = r"^[Bb]earer [A-Za-z0-9_.-]{16,512}$"
