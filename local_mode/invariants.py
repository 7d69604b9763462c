"""The backstop invariant, checked by the campaigns and the soak (docs/recovery-loop.md).

Every job that is neither RUNNING nor terminal is reachable by something scheduled: in the
deadline index (the recovery sweep's), or in the queue index while the queue owns it
(QUEUED, PENDING_RESOURCES, a SUSPENDED job queued again). A job that is in neither was
forgotten: no event is due for it and no sweep will ever look at it again.

Checks read the tables through the emulator's own client (a scan: a check, never the
product's path) and are not counted or broken by the campaigns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from gpu_recovery.domain import started_by as task_started_by
from gpu_recovery.repository import Repository

from .sim.ecs_model import Placement

# The queue's own states: the queue scheduler (every minute) reaches these through the queue index.
QUEUE_OWNED = frozenset({JobState.QUEUED, JobState.PENDING_RESOURCES, JobState.SUSPENDED})
# Due this long ago and still due: the sweep is not getting to it (or keeps failing on it).
OVERDUE_SECONDS = 15 * 60
# What a check reads of an item: its state, whether it is validating, where it is indexed
# (not the history or the goodput ledger it has no use for; measured, this saves no time that
# shows in the campaigns' runs).
_JOB_FIELDS = ("job_id", "job_state", C.QUEUE_PK, C.DEADLINE_PK, C.DEADLINE_SK)
_INSTANCE_FIELDS = ("instance_state", "validation", "suspect_origin", C.DEADLINE_PK, C.DEADLINE_SK)
# A lost node flagged SUSPECT on a missing answer (recovery.lost_node_checks): the sweep looks at
# its ECS agent until its check opens, then runs the check (models.LOST_NODE_ORIGIN).
_LOST_NODE_ORIGIN = "lost_node"


def _projected(repo: Repository, table: str, key: dict[str, Any],
               fields: Iterable[str]) -> dict[str, Any] | None:
    """The item's top-level ``fields``, read consistently; None: no item."""
    names = {f"#p{i}": field for i, field in enumerate(fields)}
    item = repo.tables.db.table(table).get_item(Key=key, ConsistentRead=True,
                                                ProjectionExpression=", ".join(names),
                                                ExpressionAttributeNames=names).get("Item")
    return dict(item) if item else None


def forgotten_validations(repo: Repository, now: float, nodes: Iterable[str], *,
                          overdue_seconds: float = OVERDUE_SECONDS) -> dict[str, str]:
    """``{node: why}`` for each of ``nodes`` (container instance ids) in validation after
    repair with nothing due: a node back from its repair must be reached by the sweep until
    its validation ends (the jobs waiting on it have their own deadlines: forgotten_jobs),
    else its jobs would wait on it for ever. Likewise a lost node flagged SUSPECT on a missing
    answer: the sweep looks at its ECS agent, then runs its check, until the check's verdict."""
    out = {}
    for node in sorted(nodes):
        item = _projected(repo, repo.tables.instance_table_name, {C.INSTANCE_PK: node}, _INSTANCE_FIELDS)
        if not item:
            continue
        state = item.get("instance_state")
        validating = state in ("REBOOTING", "SUSPECT") and item.get("validation")
        if not validating and not (state == "SUSPECT" and item.get("suspect_origin") == _LOST_NODE_ORIGIN):
            continue
        why = _not_due(repo, item, now, overdue_seconds)
        if why:
            out[node] = f"validating {why}"
    return out


def _not_due(repo: Repository, item: dict[str, Any], now: float, overdue_seconds: float) -> str:
    """Why the sweep would not reach ``item`` (in no shard of the by-deadline index, or due
    for longer than ``overdue_seconds``); "" when it will."""
    due = item.get(C.DEADLINE_SK)
    if item.get(C.DEADLINE_PK) not in repo.tables.db.deadline_buckets() or due is None:
        return "with nothing due"
    if float(due) < now - overdue_seconds:
        return f"due {now - float(due):.0f} s ago"
    return ""


def job_items(repo: Repository) -> list[dict[str, Any]]:
    table = repo.tables.db.table(repo.tables.job_table_name)
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"FilterExpression": "item_type = :j",
                              "ExpressionAttributeValues": {":j": "JOB"}}
    while True:
        page = table.scan(**kwargs)
        items += page.get("Items", [])
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def forgotten_jobs(repo: Repository, now: float, *, overdue_seconds: float = OVERDUE_SECONDS,
                   job_ids: Iterable[str] | None = None) -> dict[str, str]:
    """``{job_id: why}`` for every job (of ``job_ids``; None: every job, a scan) that breaks
    the invariant now: neither RUNNING nor terminal with nothing due (or due for longer than
    ``overdue_seconds``)."""
    out = {}
    if job_ids is None:
        items = job_items(repo)
    else:
        keys = ({C.JOB_PK: C.job_item_key(j)} for j in sorted(job_ids))
        items = [i for i in (_projected(repo, repo.tables.job_table_name, k, _JOB_FIELDS) for k in keys) if i]
    for item in items:
        state = JobState(item["job_state"])
        if state is JobState.RUNNING or state.is_terminal:
            continue
        if state in QUEUE_OWNED and item.get(C.QUEUE_PK):
            continue
        why = _not_due(repo, item, now, overdue_seconds)
        if why:
            out[str(item["job_id"])] = f"{state.value} {why}"
    return out


#: the prefixes of every ``startedBy`` the stack gives a task (``domain.started_by``)
STACK_STARTED_BY = tuple(f"{prefix}-" for prefix in task_started_by.PREFIXES)


def started_twice(placements: Iterable[Placement]) -> list[str]:
    """Tasks the stack started twice: a second task of one ``startedBy`` on one node. A
    start whose answer was lost (or a claim taken over) looks its task up by its startedBy
    before starting again; every kind's startedBy is deterministic per start (per node for
    a call of identical ranks)."""
    seen: dict[tuple[str, str], str] = {}
    twice = []
    for placed in placements:
        if not placed.started_by.startswith(STACK_STARTED_BY):
            continue
        first = seen.setdefault((placed.started_by, placed.node), placed.task_arn)
        if first != placed.task_arn:
            twice.append(f"{placed.started_by} on {placed.node} at {placed.time:.0f} s")
    return twice
