"""Launch an admitted queue job on ECS: claim it, then start its ranks through the recovery's
start fan-out (the one launcher of the stack, ``recovery.gang``).

1. **Claim**: one conditional transaction moves the job QUEUED/PENDING_RESOURCES/SUSPENDED
   -> STARTING with ``attempt + 1``, removes it from the queue index, records the launch plan
   (node per rank, MASTER_ADDR/PORT, the task definition resolved once, its container, the
   control API's URL) and the intent to start every rank (``start_fanout``, kind ``launch``),
   with the job's quota charge. Only one tick can win the claim, and only while it holds the
   scheduler's lease.
2. **Start**: the recovery's start fan-out starts the ranks (inline up to
   ``gang_inline_max_ranks``, else in batches on the gang queue): each rank under a launch lease
   on its item, with a deterministic ``startedBy`` (``domain.started_by``, the gang restart's
   format), registered at once (``recovery.launch_templates``).
3. **Finish or abort** (``recovery.queue_launches``): every rank registered completes the launch
   (``launched_at``, the attempt's entry); a rank not placed aborts it (requeued with a back-off
   for a placement failure, else FAILED) with the intent to stop the ranks started.

A tick that dies after its claim leaves the intent on the job item: the recovery sweep sends it
again (batches skip what is done, a rank's lease taken over looks its task up by startedBy
first). No rank is ever started twice.

Before the claim: the task definition is described (cached); an unknown or INACTIVE one is
USER_ERROR (the job is claimed and FAILED, never retried, its owner and operators e-mailed:
``recovery.queue_launches``); a throttled or failed lookup skips the job this tick. AWS is
reached through the adapters ``runtime.queue_scheduler`` builds (``TaskDefinitions``,
``HostAddresses``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery import clock
from gpu_recovery.adapters.task_definitions import TaskDefinitionNotFound
from gpu_recovery.constants import JobState
from gpu_recovery.domain.models import container_instance_id
from gpu_recovery.queue.admission import FailureKind, queued_relocated
from gpu_recovery.queue.attempts import last_suspend, relocation_record
from gpu_recovery.recovery.launch_templates import DEFAULT_MASTER_PORT, LaunchSpec
from gpu_recovery.repository import from_ddb
from gpu_recovery.repository.scheduling import SchedulingRepository
from gpu_recovery.repository.time_sharing import ChargeClaim
from gpu_recovery.settings import TimeSharingSettings

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_MASTER_PORT", "LaunchOutcome", "LaunchSpec", "Launcher", "PlacedNode"]

# Container-instance attribute an operator can set (ECS_INSTANCE_ATTRIBUTES) to give a
# node's address explicitly, e.g. for ECS Anywhere hosts.
HOST_ADDRESS_ATTRIBUTE = "gpu-recovery.host-address"


# ------------------------------------------------------------------ ports
class TaskDefinitionPort(Protocol):
    """``adapters.task_definitions.TaskDefinitions`` (cached DescribeTaskDefinition)."""

    def describe(self, ref: str) -> dict[str, Any]: ...


class HostAddressPort(Protocol):
    """``adapters.hosts.HostAddresses``: an instance's private IP ("" when unknown)."""

    def address(self, instance_id: str) -> str: ...


class StartsRanks(Protocol):
    """Starts the ranks of a claimed launch: the recovery's start fan-out of the job's intent
    (``recovery.RecoveryService.start_ranks``)."""

    def start_ranks(self, job_id: str) -> object: ...

    def fail_unstarted(self, job_id: str, attempt: int, why: str) -> bool:
        """The claimed attempt FAILED before any start (USER_ERROR), e-mailed; False: raced."""


def first_essential_container(td: Mapping[str, Any]) -> str:
    containers = td.get("containerDefinitions") or []
    for c in containers:
        if c.get("essential", True):
            return str(c["name"])
    return str(containers[0]["name"]) if containers else ""


INSTANCE_TYPE_ATTRIBUTE = "ecs.instance-type"


def master_address(hosts: HostAddressPort, node: PlacedNode) -> str:
    """Rank 0's address for MASTER_ADDR: the node's explicit attribute (ECS Anywhere hosts
    whose SSM address is not the one peers reach), else its private IP."""
    explicit = node.attributes.get(HOST_ADDRESS_ATTRIBUTE)
    return str(explicit) if explicit else hosts.address(node.ec2_instance_id)


@dataclass(frozen=True)
class PlacedNode:
    """What the launcher needs about a node chosen by admission."""

    container_instance_arn: str
    ec2_instance_id: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass
class LaunchOutcome:
    job_id: str
    action: str  # launched | resumed | raced | skipped | requeued | failed | interrupted | ...
    attempt: int = 0
    tasks: list[str] = field(default_factory=list)
    kind: str = ""
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in ("", [], 0) or k == "action"}


# ------------------------------------------------------------------ launcher
class Launcher:
    def __init__(self, starts: StartsRanks, task_definitions: TaskDefinitionPort, hosts: HostAddressPort,
                 store: SchedulingRepository, owner: str, *,
                 sharing: TimeSharingSettings | None = None) -> None:
        self.sharing = sharing or TimeSharingSettings()
        self.starts = starts
        self.store = store  # the scheduler's lease and the launch's claim
        self.owner = owner  # the lease owner: a claim holds only while the lease is ours
        self.task_definitions = task_definitions
        self.hosts = hosts

    def launch(self, item: Mapping[str, Any], nodes: list[PlacedNode],
               charge: ChargeClaim | None = None) -> LaunchOutcome:
        """Claim the job for a new attempt on ``nodes`` (rank i on nodes[i]), with its quota
        ``charge``, and start it. A SUSPENDED job is resumed (``RESUME_COUNT`` + 1). Only a launch
        of at most ``gang_inline_max_ranks`` ranks runs its starts in this tick; a larger one's go
        to the gang queue, so the tick's time budget does not bound a launch."""
        item = from_ddb(dict(item))
        job_id = item["job_id"]
        try:
            spec = LaunchSpec.from_item(item)
        except (KeyError, ValueError, TypeError) as error:
            return LaunchOutcome(job_id, "skipped", reason=f"malformed spec: {error}")
        master = nodes[0]
        try:
            master_addr = master_address(self.hosts, master)
        except (ClientError, BotoCoreError) as error:
            # One unreachable lookup (a terminated instance ECS still lists, throttling)
            # must not stop the whole tick: skip this job, the next tick tries again.
            logger.warning("host address lookup failed", extra={"job_id": job_id, "error": str(error)})
            return LaunchOutcome(job_id, "skipped", reason=f"no address for rank 0's host: {error}")
        if not master_addr:
            return LaunchOutcome(job_id, "skipped", reason="no address for rank 0's host")
        user_error, td_arn, container = "", spec.task_definition, spec.container_name
        try:
            td = self.task_definitions.describe(spec.task_definition)
            if str(td.get("status", "ACTIVE")).upper() == "INACTIVE":
                user_error = f"task definition {spec.task_definition} is INACTIVE"
            td_arn = str(td.get("taskDefinitionArn") or spec.task_definition)
            container = container or first_essential_container(td)
        except TaskDefinitionNotFound as error:
            # As classify_failure() has it for ClientException / InvalidParameterException.
            user_error = f"{error.code}: {error.message}"
        except (ClientError, BotoCoreError) as error:
            logger.warning("task definition lookup failed", extra={"job_id": job_id, "error": str(error)})
            return LaunchOutcome(job_id, "skipped", reason=f"task definition not described: {error}")
        current = item.get("attempt")
        attempt = int(current or 0) + 1
        now = clock.now()
        node_arns = [n.container_instance_arn for n in nodes]
        ec2_ids = [n.ec2_instance_id for n in nodes]
        # The job item keeps the plan's shape; its nodes are items of their own (a 1,024-node
        # plan is ~120 KB of ARNs). What every rank starts with is resolved here, once.
        plan = {
            "attempt": attempt,
            "world_size": len(nodes),
            "rank0_node": container_instance_id(master.container_instance_arn),
            "master_addr": master_addr,
            "master_port": spec.master_port,
            "task_definition_arn": td_arn,
            "container": container,
            "control_api_url": self.sharing.control_api_url,
            # The class the gang preflight keeps its baseline for (ECS's built-in attribute
            # of EC2 container instances; ECS Anywhere hosts have none).
            "instance_type": str(master.attributes.get(INSTANCE_TYPE_ATTRIBUTE) or ""),
            # Queued ahead of its priority (relocated): an abort requeues it there.
            "relocated": queued_relocated(item),
        }
        resumed = item.get("job_state") == JobState.SUSPENDED.value
        reason, moved = f"admitted: attempt {attempt} on {len(nodes)} node(s)", None
        if resumed:
            count = int(item.get("resume_count") or 0) + 1
            reason = (f"resumed (resume {count}, attempt {attempt}) on {len(nodes)} node(s)"
                      f"{last_suspend(item)}")
        elif item.get("relocation"):
            reason, moved = relocation_record(item, plan, node_arns, now)
        plan_items = self.store.plan_updates(job_id, attempt, node_arns, ec2_ids)
        if not self.store.claim_launch(job_id, None if current is None else int(current), attempt, plan, now,
                                       self.owner, reason, relocations=moved, charge=charge, resumed=resumed,
                                       plan_items=plan_items):
            return LaunchOutcome(job_id, "raced", attempt,
                                 reason="claim lost: canceled, taken, lease lost or quota full")
        if user_error:
            return self._fail(job_id, attempt, user_error)
        try:
            self.starts.start_ranks(job_id)
        except Exception as error:
            # The intent is on the job item: the recovery sweep sends it again.
            logger.warning("launch not sent; the recovery sweep sends it", exc_info=True,
                           extra={"job_id": job_id, "attempt": attempt})
            return LaunchOutcome(job_id, "interrupted", attempt, kind=FailureKind.UNKNOWN.value,
                                 reason=str(error))
        fresh = self.store.job_item(job_id) or {}
        if fresh.get("job_state") == JobState.FAILED.value:
            return LaunchOutcome(job_id, "failed", attempt, kind=str(fresh.get("failure_kind") or ""),
                                 reason=str(fresh.get("last_error") or ""))
        if fresh.get("job_state") == JobState.PENDING_RESOURCES.value:
            return LaunchOutcome(job_id, "requeued", attempt, kind=FailureKind.INSUFFICIENT_RESOURCES.value,
                                 reason=str(fresh.get("last_error") or ""))
        logger.info("job launched", extra={"job_id": job_id, "attempt": attempt})
        return LaunchOutcome(job_id, "launched", attempt)

    def _fail(self, job_id: str, attempt: int, reason: str) -> LaunchOutcome:
        """A task definition the job cannot start with: FAILED, never retried (nothing started),
        its owner and operators e-mailed (the recovery's ``fail_unstarted``)."""
        kind = FailureKind.USER_ERROR
        applied = self.starts.fail_unstarted(job_id, attempt, reason)
        logger.warning("launch failed", extra={"job_id": job_id, "attempt": attempt, "kind": kind.value,
                                               "reason": reason})
        return LaunchOutcome(job_id, "failed" if applied else "raced", attempt, kind=kind.value,
                             reason=reason)
