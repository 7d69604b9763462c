"""The jobs API (API Gateway REST, IAM auth): submit, get, list, cancel, suspend, resume,
events, logs, node quotas.

Routes (Powertools ``APIGatewayRestResolver`` with validation; OpenAPI at ``/swagger``):

    POST /v1/jobs                      201 submit (``Idempotency-Key`` header honoured)
    GET  /v1/jobs                      200 list, newest first (state=, user=, limit=, next_token=)
    GET  /v1/jobs/{job_id}             200 detail: ranks, attempts, last error
    POST /v1/jobs/{job_id}/cancel      200 cancel (idempotent)
    GET  /v1/jobs/{job_id}/events      200 state history
    GET  /v1/jobs/{job_id}/logs        200 one rank's container log (rank=, attempt=, next_token=)
    POST /v1/jobs/{job_id}/suspend     200 graceful suspend, held until resumed
    POST /v1/jobs/{job_id}/resume      200 back to the queue at its original position
    GET  /v1/quotas                    200 your node quotas (user=, all=true: admins)
    PUT  /v1/quotas                    200 set a user's quota at a level (admins)
    DELETE /v1/quotas?user=&priority=  200 remove it (admins)

Errors: ``{"error": code, "message": "...", "field": "..."}``: 400 (field named: also a
body that is not UTF-8, not JSON or nested deeper than 32 levels), 403 (an authorization
rule, named in ``error`` as ``forbidden:<rule>``: see ``gpu_recovery.queue.access``), 404,
409, 413, 415 (a submit body that is not ``application/json``); API Gateway adds 403
(IAM signature) and 429 (throttling) in the same shape. ``python -m handlers.jobs_api
--openapi`` prints the OpenAPI document (committed as ``docs/openapi.json``).
"""

from __future__ import annotations

import json
import threading
from functools import partial
from http import HTTPStatus
from pathlib import Path as FilePath
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Path, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyValidationError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpu_recovery import runtime
from gpu_recovery.adapters import aws
from gpu_recovery.constants import MAX_WORLD_SIZE, JobState
from gpu_recovery.queue.api_models import (
    CancelResult,
    JobDetail,
    JobEvents,
    JobList,
    JobLogs,
    JobSummary,
    QuotaChange,
    QuotaList,
    QuotaRemoved,
    QuotaRow,
    QuotaView,
    SuspendResult,
)
from gpu_recovery.queue.jobs_api.errors import IdempotencyKeyReused, QueueError
from gpu_recovery.queue.jobs_api.reads import DEFAULT_LIMIT, DEFAULT_RANKS, MAX_LIMIT, MAX_RANKS
from gpu_recovery.queue.jobs_api.service import JobQueueService
from gpu_recovery.queue.jobs_api.submit import IDEMPOTENCY_WINDOW_SECONDS
from gpu_recovery.queue.jobs_api.triggers import SchedulerTrigger
from gpu_recovery.queue.models import JobSpec
from gpu_recovery.queue.spec_errors import first_problem
from handlers._common import powertools
from handlers._http import BodyError, guarded_body
from handlers._openapi import (
    as_answered,
    authorization_header_scheme,
    document_json,
    error_doc,
    print_document,
)

API_TITLE = "GPU training jobs API"
API_VERSION = "1.0.0"
MAX_BODY_BYTES = 128 * 1024
IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_TTL_SECONDS = IDEMPOTENCY_WINDOW_SECONDS
LOCAL_USER_HEADER = "X-Local-User"
DEFAULT_LOCAL_USER = "arn:aws:iam::123456789012:user/local"
JOB_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,80}$"

logger, tracer, metrics = powertools("jobs-api")
app = APIGatewayRestResolver(enable_validation=True)
# One description of the API for the Swagger UI and the committed OpenAPI document.
OPENAPI_INFO: dict[str, Any] = {
    "title": API_TITLE,
    "version": API_VERSION,
    "description": "Submit multi-node GPU training jobs to the queue and follow them on Amazon ECS.",
    "security_schemes": {
        "sigv4": authorization_header_scheme(
            "AWS Signature Version 4 (API Gateway AuthorizationType AWS_IAM)"),
    },
    "security": [{"sigv4": []}],
}


_E400 = error_doc("Invalid request; `field` names the offending field")
_E403 = error_doc("Refused: a missing or invalid SigV4 signature (API Gateway), or an "
                   "authorization rule named in `error` (`forbidden:ownership`, "
                   "`forbidden:tag_registered`, `forbidden:task_definition_family`, "
                   "`forbidden:task_role`, `forbidden:reserved_priority`, `forbidden:task_network`)")
_E404 = error_doc("Unknown job")
_E429 = error_doc("Throttled by the API stage (API Gateway)")
_READ_ERRORS: dict[int, OpenAPIResponse] = {400: _E400, 403: _E403, 404: _E404, 429: _E429}


# ------------------------------------------------------------------------------ wiring
_lock = threading.Lock()
_state: dict[str, Any] = {}


def set_scheduler_trigger(trigger: SchedulerTrigger | None) -> None:
    """Local mode: install an in-process trigger (``CallbackSchedulerTrigger``)."""
    with _lock:
        _state["trigger"] = trigger
        service = _state.get("service")
    if service is not None and trigger is not None:
        service.scheduler = trigger


def reset() -> None:
    """Forget cached clients/services (tests and local mode switch environments).

    It also drops the boto3 session (``runtime.reset``): call it before entering the
    emulator (``LocalAws``), whose hooks live on the session it creates."""
    with _lock:
        _state.clear()
    runtime.reset()


def service() -> JobQueueService:
    with _lock:
        svc = _state.get("service")
        if svc is None:
            svc = runtime.jobs_service(_state.get("trigger"))
            _state["service"] = svc
        return svc


def _idempotency() -> tuple[IdempotencyConfig, Any]:
    """The idempotent submit, built once (Powertools persistence on the idempotency table)."""
    with _lock:
        built = _state.get("idempotency")
        if built is None:
            config = IdempotencyConfig(
                event_key_jmespath="[caller, key]",
                payload_validation_jmespath="spec",
                expires_after_seconds=IDEMPOTENCY_TTL_SECONDS,
                raise_on_no_idempotency_key=True,
                response_hook=_mark_replay,
            )
            # The one DynamoDB use outside the repository (tests/test_architecture.py): the
            # Powertools layer owns its table and record format.
            store = DynamoDBPersistenceLayer(
                table_name=runtime.jobs_api_settings().idempotency_table,
                boto3_client=aws.client("dynamodb"),
            )
            submit = idempotent_function(
                data_keyword_argument="request", config=config, persistence_store=store
            )(_submit_once)
            built = (config, submit)
            _state["idempotency"] = built
        return built


def _submit_once(request: dict[str, Any]) -> dict[str, Any]:
    spec = JobSpec.model_validate(request["spec"])
    # The key goes on with the job too: a retry whose Powertools record expired (the first
    # try timed out after writing the job) or was dropped still finds the job it made.
    submitted = service().submit_once(spec, request["caller"], request["key"])
    if submitted.replayed:
        app.append_context(idempotent_replay=True)
    return submitted.job


def _mark_replay(response: Any, idempotent_data: DataRecord) -> Any:
    app.append_context(idempotent_replay=True)
    return response


# ------------------------------------------------------------------------------ helpers
def caller() -> str:
    """IAM identity of the signed request; local mode falls back to ``X-Local-User``."""
    context = app.current_event.request_context
    identity = context.identity
    if identity.user_arn:
        return identity.user_arn
    if identity.caller:
        return identity.caller
    authorizer = app.current_event.raw_event.get("requestContext", {}).get("authorizer") or {}
    principal = authorizer.get("principalId") if isinstance(authorizer, dict) else None
    if principal:
        return str(principal)
    # No IAM identity at all: only local mode (every deployed method is AWS_IAM) gets here.
    return _header(LOCAL_USER_HEADER) or DEFAULT_LOCAL_USER


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body,
                    headers=headers)


def error_response(status: int, code: str, message: str, field: str | None = None) -> Response:
    body: dict[str, Any] = {"error": code, "message": message}
    if field:
        body["field"] = field
    return _json(status, body)


@app.exception_handler(RequestValidationError)
def _invalid(error: RequestValidationError) -> Response:
    # The one line the CLI's --dry-run gives too (gpu_recovery.queue.spec_errors).
    errors = list(error.errors())
    body = [e for e in errors if str((e.get("loc") or ("",))[0]) == "body"]
    field, message = first_problem(body, JobSpec) if body else first_problem(errors)
    return error_response(400, "validation_error", f"{field}: {message}", field)


@app.exception_handler(QueueError)
def _queue_error(error: QueueError) -> Response:
    return _json(error.status, error.body())


@app.exception_handler(IdempotencyValidationError)
def _idempotency_mismatch(error: IdempotencyValidationError) -> Response:
    return _queue_error(IdempotencyKeyReused())


@app.exception_handler(IdempotencyAlreadyInProgressError)
def _idempotency_in_progress(error: IdempotencyAlreadyInProgressError) -> Response:
    return error_response(409, "idempotency_in_progress",
                          f"a request with this {IDEMPOTENCY_HEADER} is still being processed; retry")


@app.not_found
def _not_found(error: Exception) -> Response:
    return error_response(404, "not_found", f"no route {app.current_event.http_method} "
                          f"{app.current_event.path}")


# ------------------------------------------------------------------------------- routes
@app.post(
    "/v1/jobs",
    summary="Submit a job",
    description="Queues a multi-node job. With an Idempotency-Key header a retried submission "
    "returns the same job (24 h; 201 with Idempotent-Replayed: true), also when the first try "
    "wrote the job but never answered; the same key with a different body is refused with 409.",
    responses={
        201: {"description": "Queued", "content": {"application/json": {"model": JobSummary}}},
        400: _E400,
        403: _E403,
        409: error_doc("Idempotency-Key reused with another body, or still in progress"),
        413: error_doc("Body over 128 KiB"),
        415: error_doc("Content-Type is not application/json"),
        429: _E429,
    },
    tags=["jobs"],
)
def submit_job(
    spec: Annotated[JobSpec, Body()],
    idempotency_key: Annotated[
        str | None, Header(alias=IDEMPOTENCY_HEADER, max_length=255, description="Retry-safe key")
    ] = None,
) -> Response[JobSummary]:
    who = caller()
    key = idempotency_key or _header(IDEMPOTENCY_HEADER)
    if key:
        _, submit = _idempotency()
        result = submit(request={"caller": who, "key": key, "spec": spec.model_dump(mode="json")})
    else:
        result = service().submit(spec, who)
    metrics.add_metric(name="JobsSubmitted", unit=MetricUnit.Count, value=1)
    headers = {"Location": f"/v1/jobs/{result['job_id']}"}
    if app.context.get("idempotent_replay"):
        headers["Idempotent-Replayed"] = "true"
    return _json(HTTPStatus.CREATED, result, headers)


@app.get("/v1/jobs", summary="List jobs, newest first", tags=["jobs"],
         description="Your own jobs; admin roles see every job, and may (like a team role for "
         "sessions of the same role) name another principal with user=.",
         responses={
             200: {"description": "A page of jobs", "content": {"application/json": {"model": JobList}}},
             400: _E400, 403: _E403, 429: _E429,
         })
def list_jobs(
    state: Annotated[JobState | None, Query(description="Only jobs in this state")] = None,
    user: Annotated[str | None, Query(description="Only jobs of this user (IAM ARN)",
                                      max_length=2048)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    next_token: Annotated[str | None, Query(max_length=4096, description="From the previous page")] = None,
) -> JobList:
    return JobList.model_validate(
        service().list(state=state, user=user, limit=limit, next_token=next_token, caller=caller()))


@app.get("/v1/jobs/<job_id>", summary="A job with a page of its ranks, and its attempts", tags=["jobs"],
         responses={200: {"description": "The job", "content": {"application/json": {"model": JobDetail}}},
                    **_READ_ERRORS})
def get_job(
    job_id: Annotated[str, Path(pattern=JOB_ID_PATTERN)],
    ranks_from: Annotated[int, Query(ge=0, description="The first rank of the page (ranks_next of "
                                                          "the previous one)")] = 0,
    ranks_limit: Annotated[int, Query(ge=1, le=MAX_RANKS, description="Ranks in the page")] = DEFAULT_RANKS,
) -> JobDetail:
    return JobDetail.model_validate(service().get(job_id, caller(), ranks_from=ranks_from,
                                                  ranks_limit=ranks_limit))


@app.post("/v1/jobs/<job_id>/cancel", summary="Cancel a job (idempotent)", tags=["jobs"],
          description="QUEUED/PENDING_RESOURCES: CANCELED now. Running: CANCELING, every live rank "
          "is stopped, CANCELED once all stopped. Terminal: unchanged, 200.",
          responses={200: {"description": "Outcome",
                           "content": {"application/json": {"model": CancelResult}}},
                     **_READ_ERRORS,
                     409: error_doc("The job kept changing state; retry")})
def cancel_job(job_id: Annotated[str, Path(pattern=JOB_ID_PATTERN)]) -> CancelResult:
    result = service().cancel(job_id, caller())
    if result.pop("ended", False):  # this call's write made it CANCELED: its goodput, once
        # Imported here: the jobs API loads no recovery module for its other requests (cold start).
        from gpu_recovery.recovery.goodput_metrics import emit_job_end
        from gpu_recovery.recovery.ports import after_commit
        after_commit("goodput metrics", emit_job_end, runtime.PowertoolsMetrics(metrics),
                     partial(service().repo.job_item, job_id))
    if result["changed"]:
        metrics.add_metric(name="JobsCanceled", unit=MetricUnit.Count, value=1)
    return CancelResult.model_validate(result)


@app.post("/v1/jobs/<job_id>/suspend", summary="Suspend a job (graceful; held until resumed)",
          tags=["jobs"],
          description="RUNNING: SUSPENDING; rank 0 is told (receive_suspend_command()) and has the job's "
          "grace to checkpoint and call go_suspend(), then every rank is stopped (by force after the "
          "grace); SUSPENDED once all stopped. Waiting: SUSPENDED now. Either way the job is held "
          "until resumed. A suspension spends no recovery and no retry.",
          responses={200: {"description": "Outcome",
                           "content": {"application/json": {"model": SuspendResult}}},
                     **_READ_ERRORS,
                     409: error_doc("Not suspendable now (starting, in recovery, ended, or not a "
                                     "queue job)")})
def suspend_job(job_id: Annotated[str, Path(pattern=JOB_ID_PATTERN)]) -> SuspendResult:
    result = service().suspend(job_id, caller())
    if result["changed"]:
        metrics.add_metric(name="JobsSuspendedByUser", unit=MetricUnit.Count, value=1)
    return SuspendResult.model_validate(result)


@app.post("/v1/jobs/<job_id>/resume", summary="Resume a suspended job", tags=["jobs"],
          description="A held SUSPENDED job goes back to the queue at its original position (the "
          "scheduler starts it like a queued job, with RESUME_COUNT + 1); a SUSPENDING one once its "
          "ranks stopped. A job the scheduler suspended is already queued: unchanged.",
          responses={200: {"description": "Outcome",
                           "content": {"application/json": {"model": SuspendResult}}},
                     **_READ_ERRORS,
                     409: error_doc("Not suspended")})
def resume_job(job_id: Annotated[str, Path(pattern=JOB_ID_PATTERN)]) -> SuspendResult:
    return SuspendResult.model_validate(service().resume(job_id, caller()))


_QUOTA_ERRORS: dict[int, OpenAPIResponse] = {
    400: _E400,
    403: error_doc("Refused: SigV4 (API Gateway), or `forbidden:admin` (only admin roles set, remove, "
                    "list all or read another user's quota)"),
    409: error_doc("Quotas are not configured in this deployment"),
    429: _E429,
}


@app.get("/v1/quotas", summary="Node quotas", tags=["quotas"],
         description="Without parameters: your quota at every priority level (limit, nodes in use, "
         "room). user=: that user's (admins). all=true: every stored quota, a page at a time (admins).",
         responses={200: {"description": "QuotaView, or QuotaList with all=true",
                          "content": {"application/json": {"model": QuotaView | QuotaList}}},
                    **_QUOTA_ERRORS})
def get_quotas(
    user: Annotated[str | None, Query(max_length=512, description="IAM ARN or quota user")] = None,
    all_users: Annotated[bool, Query(alias="all", description="Every stored quota (admins)")] = False,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    next_token: Annotated[str | None, Query(max_length=4096)] = None,
) -> QuotaView | QuotaList:
    if all_users:
        return QuotaList.model_validate(service().quota_list(caller(), limit=limit, next_token=next_token))
    return QuotaView.model_validate(service().quota_view(caller(), user))


@app.put("/v1/quotas", summary="Set a user's node quota at one level (admins)", tags=["quotas"],
         responses={200: {"description": "The quota now",
                          "content": {"application/json": {"model": QuotaRow}}},
                    **_QUOTA_ERRORS,
                    415: error_doc("Content-Type is not application/json")})
def put_quota(change: Annotated[QuotaChange, Body()]) -> QuotaRow:
    return QuotaRow.model_validate(
        service().quota_set(caller(), change.user, change.priority, change.max_nodes))


@app.delete("/v1/quotas", summary="Remove a user's node quota at one level (admins)", tags=["quotas"],
            description="The deployment's default (or no limit) applies again; usage is kept.",
            responses={200: {"description": "What applies now",
                             "content": {"application/json": {"model": QuotaRemoved}}},
                       **_QUOTA_ERRORS})
def delete_quota(
    user: Annotated[str, Query(min_length=1, max_length=512, description="IAM ARN or quota user")],
    priority: Annotated[str, Query(min_length=1, max_length=16, description="Level name or value")],
) -> QuotaRemoved:
    return QuotaRemoved.model_validate(service().quota_remove(caller(), user, priority))


@app.get("/v1/jobs/<job_id>/events", summary="State history of a job", tags=["jobs"],
         responses={200: {"description": "Events, oldest first",
                          "content": {"application/json": {"model": JobEvents}}},
                    **_READ_ERRORS})
def job_events(job_id: Annotated[str, Path(pattern=JOB_ID_PATTERN)]) -> JobEvents:
    return JobEvents.model_validate(service().events(job_id, caller()))


@app.get("/v1/jobs/<job_id>/logs", summary="Container log of one rank", tags=["jobs"],
         description="CloudWatch Logs of the rank's training container (awslogs driver of the task "
         "definition), oldest first.",
         responses={200: {"description": "A page of log events",
                          "content": {"application/json": {"model": JobLogs}}},
                    **_READ_ERRORS})
def job_logs(
    job_id: Annotated[str, Path(pattern=JOB_ID_PATTERN)],
    rank: Annotated[int, Query(ge=0, le=MAX_WORLD_SIZE - 1)] = 0,
    attempt: Annotated[int | None, Query(ge=1, le=10000, description="Default: the current attempt")] = None,
    next_token: Annotated[str | None, Query(max_length=4096)] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 200,
) -> JobLogs:
    return JobLogs.model_validate(service().logs(job_id, rank=rank, attempt=attempt, next_token=next_token,
                                                 limit=limit, user=caller()))


@app.get("/swagger", include_in_schema=False)
def swagger() -> Response[str]:
    """Swagger UI of the committed OpenAPI document (``?format=json``: the document)."""
    from aws_lambda_powertools.event_handler.openapi.swagger_ui import generate_swagger_html

    spec = document_json(openapi_document()).replace("</", "<\\/")
    if (app.current_event.query_string_parameters or {}).get("format") == "json":
        return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=spec)
    ui = FilePath(generate_swagger_html.__code__.co_filename).parent
    html = generate_swagger_html(spec, (ui / "swagger-ui-bundle.min.js").read_text(encoding="utf-8"),
                                 (ui / "swagger-ui.min.css").read_text(encoding="utf-8"), "", None)
    return Response(status_code=200, content_type="text/html", body=html)


def _header(name: str) -> str | None:
    headers = app.current_event.headers or {}
    return next((v for k, v in headers.items() if k.lower() == name.lower()), None)


# ------------------------------------------------------------------------------ entry


def _error_result(status: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"statusCode": status, "headers": {"Content-Type": content_types.APPLICATION_JSON},
            "body": json.dumps(body), "isBase64Encoded": False}


def _json_body_route(event: dict[str, Any]) -> bool:
    """Routes whose body is a JSON document (submit, quota change)."""
    path = str(event.get("path") or "").rstrip("/")
    method = event.get("httpMethod")
    return (method == "POST" and (path == "/v1/jobs" or path.endswith("/prod/v1/jobs"))) or (
        method == "PUT" and (path == "/v1/quotas" or path.endswith("/prod/v1/quotas")))


def _guard_body(event: dict[str, Any]) -> dict[str, Any]:
    """Everything that can be wrong with a body before routing becomes a 4xx: size (413),
    encoding and JSON (400), media type of a submit (415). Returns the event with the
    body as UTF-8 text, so the resolver's own parsing cannot fail."""
    text = guarded_body(event, MAX_BODY_BYTES, json_route=_json_body_route(event))
    return {**event, "body": text if text else None, "isBase64Encoded": False}


@logger.inject_lambda_context(correlation_id_path="requestContext.requestId")
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        event = _guard_body(event)
    except BodyError as error:
        return _error_result(error.status, error.body())
    config, _ = _idempotency()
    config.register_lambda_context(context)
    return app.resolve(event, context)


# ---------------------------------------------------------------------------- OpenAPI
def openapi_document() -> dict[str, Any]:
    """The resolver's OpenAPI document with the status codes the API really answers: the
    resolver's generic 422 is replaced by the 400 this API returns (ErrorBody)."""
    too_large = {"description": "Body over 128 KiB (checked on every route)",
                 "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
    return as_answered(app.get_openapi_json_schema(**OPENAPI_INFO), **{"413": too_large})


def main(argv: list[str] | None = None) -> int:
    return print_document("jobs_api", "docs/openapi.json", openapi_document, argv)


if __name__ == "__main__":
    raise SystemExit(main())
