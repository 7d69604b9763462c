"""A rank's training log (the awslogs driver's stream), oldest first, page by page."""

from __future__ import annotations

import json
from typing import Any

from gpu_recovery.adapters.logs import InvalidLogToken, LogStreamNotFound
from gpu_recovery.adapters.task_definitions import TaskDefinitionNotFound
from gpu_recovery.domain.models import EARLIER_TASKS_KEPT, task_id
from gpu_recovery.queue.jobs_api.context import JobsApiContext
from gpu_recovery.queue.jobs_api.errors import InvalidRequest, JobNotFound

LOG_EVENTS_LIMIT = 200
# GetLogEvents may answer an empty page while more events exist (GetLogEvents API reference):
# a request follows the forward token over empty pages, at most this many pages, and the
# stream's end is the token coming back as it was passed, never an empty page.
LOG_PAGES_PER_REQUEST = 5


def job_logs(
    context: JobsApiContext,
    job_id: str,
    *,
    rank: int = 0,
    attempt: int | None = None,
    next_token: str | None = None,
    limit: int = LOG_EVENTS_LIMIT,
    user: str | None = None,
) -> dict[str, Any]:
    """One rank's container log (awslogs driver), oldest first, page by page."""
    item = context.readable(job_id, user)
    world_size = int(item.get("world_size", 0))
    if not 0 <= rank < max(world_size, 1):
        raise InvalidRequest(f"rank: must be between 0 and {max(world_size - 1, 0)}", "rank")
    current_attempt = int(item.get("attempt", 0))
    attempt = current_attempt if attempt is None else attempt
    if attempt < 1 or attempt > current_attempt:
        if current_attempt == 0:
            raise JobNotFound(f"job {job_id} has not started yet: no logs")
        raise InvalidRequest(f"attempt: must be between 1 and {current_attempt}", "attempt")
    task_arn, task_def = _task_of(context, item["job_id"], rank, attempt)
    if not task_arn:
        raise JobNotFound(f"no task recorded for rank {rank} of attempt {attempt} (it never started, or "
                          f"it is more than {EARLIER_TASKS_KEPT} attempts old)")
    spec = json.loads(item.get("spec_json") or "{}")
    group, stream = _log_location(context, task_def or spec.get("task_definition", ""),
                                       spec.get("container_name"), task_arn)
    token = next_token
    events: list[dict[str, Any]] = []
    end = False
    for _ in range(LOG_PAGES_PER_REQUEST):
        try:
            page = context.log_reader.read_stream(group, stream, limit=limit, next_token=token)
        except LogStreamNotFound as error:
            raise JobNotFound(f"log stream {stream} not found in {group} (yet)") from error
        except InvalidLogToken as error:
            raise InvalidRequest("next_token: is not valid for this log stream", "next_token") from error
        events, forward = page["events"], page["next_token"]
        end = forward == token
        if events or end or not forward:
            break
        token = forward
    return {
        "job_id": job_id,
        "rank": rank,
        "attempt": attempt,
        "task_arn": task_arn,
        "log_group": group,
        "log_stream": stream,
        "events": events,
        "next_token": forward,
        "end_of_stream": end or not forward,
    }


def _task_of(context: JobsApiContext, job_id: str, rank: int, attempt: int) -> tuple[str, str]:
    """The rank's task ARN in that attempt (and its task definition), from the rank item:
    the current attempt's task, or one of the earlier tasks it keeps (one GetItem, whatever
    the job's size)."""
    found = context.repo.get_rank(job_id, rank)
    task = found.task_of_attempt(attempt) if found is not None else None
    return (task.task_arn, task.task_definition_arn) if task is not None else ("", "")


def _log_location(context: JobsApiContext, task_definition: str, container_name: str | None,
                  task_arn: str) -> tuple[str, str]:
    try:
        task_def = context.task_definitions.describe(task_definition)
    except TaskDefinitionNotFound as error:
        raise JobNotFound(f"task definition {task_definition} no longer exists") from error
    containers = task_def.get("containerDefinitions", [])
    container = next((c for c in containers if c.get("name") == container_name),
                     containers[0] if containers else {})
    config = container.get("logConfiguration") or {}
    options = config.get("options") or {}
    if config.get("logDriver") != "awslogs" or not options.get("awslogs-group"):
        raise JobNotFound(
            f"container {container.get('name', '?')} of {task_definition} does not log to "
            "CloudWatch Logs (awslogs driver)"
        )
    prefix = options.get("awslogs-stream-prefix")
    if not prefix:
        raise JobNotFound("the awslogs configuration has no awslogs-stream-prefix: stream unknown")
    return options["awslogs-group"], f"{prefix}/{container['name']}/{task_id(task_arn)}"
