"""Amazon ECS adapter: the handful of ECS calls the recovery loop makes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery.adapters.ecs_budget import CallBudget, Unlimited
from gpu_recovery.adapters.errors import NOT_SENT
from gpu_recovery.domain import ecs_instance_status as ecs_status

logger = logging.getLogger(__name__)

# ECS answers StartTask, DescribeTasks, DescribeContainerInstances and
# UpdateContainerInstancesState with HTTP 200 and a ``failures`` list naming the resources it
# did not act on ("API failure reasons", ECS developer guide): a successful call is not a
# successful action. MISSING: the cluster has no such resource (a task expired an hour after
# it stopped, an instance deregistered; or not yet: ECS is eventually consistent);
# INACTIVE (the status's word): the container instance was deregistered.
MISSING = "MISSING"


class EcsActionFailed(RuntimeError):
    """The call succeeded but ECS named the resource in ``failures``: nothing was done to it."""

    def __init__(self, operation: str, failures: Sequence[Mapping[str, Any]]) -> None:
        self.operation = operation
        self.failures = [dict(f) for f in failures]
        reasons = ", ".join(f"{f.get('arn', '?')}: {f.get('reason', '?')}"
                            + (f" ({f['detail']})" if f.get("detail") else "") for f in failures)
        super().__init__(f"{operation} answered with failures: {reasons}")

    @classmethod
    def missing(cls, operation: str, arns: Sequence[str]) -> EcsActionFailed:
        """ECS answered these resources MISSING where the caller cannot take that for an answer."""
        return cls(operation, [{"arn": arn, "reason": MISSING} for arn in arns])


def _unexpected_failures(operation: str, response: Mapping[str, Any]) -> None:
    """A describe call's failures other than MISSING (the resource not found, which the
    caller sees as not returned) are raised."""
    odd = [f for f in response.get("failures") or [] if f.get("reason") != MISSING]
    if odd:
        raise EcsActionFailed(operation, odd)
# PutAttributes / DeleteAttributes take at most 10 attributes a call (the ECS API reference).
ATTRIBUTES_PER_CALL = 10


@dataclass(frozen=True)
class StartResult:
    task_arns: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    # container instance ARN -> task ARN (a StartTask on several instances starts one on each)
    placed: dict[str, str] = field(default_factory=dict)

    @property
    def placement_failed(self) -> bool:
        """ECS answers 200 with ``failures`` when a task cannot be placed."""
        return not self.task_arns and bool(self.failures)


class AttributeLimitExceeded(Exception):
    """ECS refused PutAttributes: the container instance already carries the 10 custom
    attributes a resource takes (the stack's and its users' together: ECS API Reference,
    PutAttributes, AttributeLimitExceededException)."""

    def __init__(self, container_instance: str) -> None:
        super().__init__(f"{container_instance} carries 10 custom attributes: ECS takes no more")
        self.container_instance = container_instance


class EcsAdapter:
    """Every control-plane call (StartTask, StopTask, UpdateContainerInstancesState) takes
    a token from the stack's shared budget first (``gpu_recovery.adapters.ecs_budget``)."""

    def __init__(self, ecs_client: Any, cluster: str, budget: CallBudget | None = None,
                 describe_budget: CallBudget | None = None) -> None:
        self._ecs = ecs_client
        self.cluster = cluster
        self.budget: CallBudget = budget or Unlimited()
        # DescribeTasks of unknown tasks (registration by tags): the stack's Describe budget.
        self.describe_budget: CallBudget = describe_budget or Unlimited()
        self._credits = 0
        self._lock = threading.Lock()

    def prepay(self, calls: int, *, in_turn_within: float | None = None) -> None:
        """Take the tokens of ``calls`` coming control-plane calls at once (one write to the
        budget for a whole batch); may raise ``RateLimited``. ``in_turn_within``: reserve
        them if due within that many seconds and wait for their turn (``EcsCallBudget``)."""
        if calls <= 0:
            return
        self.budget.acquire(calls, in_turn_within=in_turn_within)
        with self._lock:
            self._credits += calls

    def _take_token(self) -> None:
        with self._lock:
            if self._credits > 0:
                self._credits -= 1
                return
        try:
            self.budget.acquire(1)
        except Exception as error:
            # No ECS call was made: a caller that would have to look up what a lost answer did
            # knows there is nothing to look up (``errors.not_sent``).
            setattr(error, NOT_SENT, True)
            raise

    def start_task(
        self,
        *,
        task_definition: str,
        container_instance_arn: str = "",
        overrides: dict[str, Any] | None = None,
        tags: list[dict[str, str]] | None = None,
        started_by: str = "",
        group: str | None = None,
        container_instance_arns: Sequence[str] = (),
        network_configuration: dict[str, Any] | None = None,
    ) -> StartResult:
        """One task on ``container_instance_arn``, or one on each of up to 10
        ``container_instance_arns`` (one set of overrides and tags for all).
        ``network_configuration``: an awsvpc task's (``domain.task_network``), which ECS
        requires for that network mode and refuses for the others."""
        instances = list(container_instance_arns) or [container_instance_arn]
        params: dict[str, Any] = {
            "cluster": self.cluster,
            "taskDefinition": task_definition,
            "containerInstances": instances,
            "overrides": overrides or {},
        }
        # "aws:" tags are ECS-managed and rejected by StartTask: replay only ours.
        user_tags = [t for t in tags or [] if not t.get("key", "").startswith("aws:")]
        if user_tags:
            params["tags"] = user_tags
        if started_by:
            params["startedBy"] = started_by[:36]
        if group:
            params["group"] = group
        if network_configuration:
            params["networkConfiguration"] = network_configuration
        self._take_token()
        response = self._ecs.start_task(**params)
        tasks = response.get("tasks", [])
        return StartResult(
            task_arns=[t["taskArn"] for t in tasks],
            failures=list(response.get("failures", [])),
            placed={str(t.get("containerInstanceArn", "")): t["taskArn"] for t in tasks},
        )

    def stop_task(self, task_arn: str, reason: str) -> None:
        self._take_token()
        self._stop(task_arn, reason)

    def stop_task_before_deadline(self, task_arn: str, reason: str) -> None:
        """StopTask of a rank on a node AWS takes at a deadline (``recovery.deadline_calls``):
        its token taken as any call's, but the budget's own item unreadable or unwritten (a
        throttled or lost DynamoDB call, whose write may have landed) does not hold the stop
        back: the next try may come after the node is gone. A spent budget still does."""
        try:
            self._take_token()
        except (ClientError, BotoCoreError) as error:
            logger.warning("ECS budget not taken: a stop before AWS's deadline is sent anyway",
                           extra={"task": task_arn, "error": str(error)})
        self._stop(task_arn, reason)

    def _stop(self, task_arn: str, reason: str) -> None:
        try:
            self._ecs.stop_task(cluster=self.cluster, task=task_arn, reason=reason[:255])
        except self._ecs.exceptions.InvalidParameterException as error:
            # Already stopped and expired from ECS: nothing left to stop.
            logger.info("stop_task on a task ECS no longer knows", extra={"task": task_arn,
                                                                          "error": str(error)})

    def stop_task_if_known(self, task_arn: str, reason: str) -> bool:
        """StopTask for the jobs API's cancel; False when ECS refuses the ARN as one it does not
        know (InvalidParameterException or ClientException: a task long stopped and expired,
        or an ARN of another cluster). Other errors (throttling, denied) are raised."""
        self._take_token()
        try:
            self._ecs.stop_task(cluster=self.cluster, task=task_arn, reason=reason[:255])
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code not in ("InvalidParameterException", "ClientException"):
                raise
            logger.info("stop_task on a task ECS no longer knows", extra={"task": task_arn})
            return False
        return True

    def describe_task(self, task_arn: str) -> dict[str, Any] | None:
        """One task with its tags (DescribeTasks returns tags only with include=TAGS); None
        when ECS answers it MISSING (expired, or not visible yet). Other failures are raised
        (:class:`EcsActionFailed`)."""
        self.describe_budget.acquire(1)
        response = self._ecs.describe_tasks(cluster=self.cluster, tasks=[task_arn], include=["TAGS"])
        _unexpected_failures("DescribeTasks", response)
        tasks = response.get("tasks", [])
        return tasks[0] if tasks else None

    def describe_tasks(self, task_arns: Sequence[str]) -> list[dict[str, Any]]:
        """Up to 100 tasks at a time (their container instances, for a grouped start); the
        tasks ECS answers MISSING are not returned (the caller compares, where it matters)."""
        found: list[dict[str, Any]] = []
        arns = list(task_arns)
        for start in range(0, len(arns), 100):
            self.describe_budget.acquire(1)
            response = self._ecs.describe_tasks(cluster=self.cluster, tasks=arns[start:start + 100],
                                                include=["TAGS"])
            _unexpected_failures("DescribeTasks", response)
            found.extend(response.get("tasks", []))
        return found

    def tasks_started_by(self, started_by: str) -> list[str]:
        """ARNs of the live tasks (desired status RUNNING: pending or running, not asked to
        stop) carrying a deterministic startedBy: what a retried start must not start again.

        ECS takes ``startedBy`` only as the one filter (anything beside it, ``desiredStatus``
        included, is an InvalidParameterException), and then lists what its default filter,
        desired status RUNNING, lists. A task of that startedBy that already stopped is not
        found here: :meth:`stopped_task_started_by` looks for it on its node."""
        arns: list[str] = []
        paginator = self._ecs.get_paginator("list_tasks")
        for page in paginator.paginate(cluster=self.cluster, startedBy=started_by[:36]):
            arns.extend(page.get("taskArns", []))
        return arns

    def stopped_task_started_by(self, container_instance: str, started_by: str) -> dict[str, Any] | None:
        """The task of ``started_by`` that already stopped on one container instance, while ECS
        still lists it (desired status STOPPED: about an hour after it stopped), which
        :meth:`tasks_started_by` cannot find: a start whose answer was lost and whose task ran to
        its end before the start was resumed. ListTasks of the instance (up to 100 of its
        stopped tasks), DescribeTasks of them; the task described, None when none carries it."""
        arns = self._ecs.list_tasks(cluster=self.cluster, containerInstance=container_instance,
                                    desiredStatus="STOPPED", maxResults=100).get("taskArns", [])
        wanted = started_by[:36]
        return next((task for task in (self.describe_tasks(arns) if arns else ())
                     if task.get("startedBy") == wanted), None)

    def tasks_tagged(self, tag_key: str, tag_value: str) -> list[dict[str, Any]]:
        """The cluster's tasks carrying a tag, running or recently stopped (ECS lists a stopped
        task for about an hour): ListTasks by desired status + DescribeTasks with TAGS.

        Costs one DescribeTasks per 100 tasks listed: used only on the rare path where a
        rank's RUNNING event never arrived, never per event. A stopped one is a rank whose
        STOPPED event may be lost too: its node is still the job's.
        """
        found: list[dict[str, Any]] = []
        paginator = self._ecs.get_paginator("list_tasks")
        for status in ("RUNNING", "STOPPED"):
            for page in paginator.paginate(cluster=self.cluster, desiredStatus=status):
                arns = page.get("taskArns", [])
                for start in range(0, len(arns), 100):
                    response = self._ecs.describe_tasks(
                        cluster=self.cluster, tasks=arns[start : start + 100], include=["TAGS"]
                    )
                    _unexpected_failures("DescribeTasks", response)  # MISSING: stopped and gone since
                    for task in response.get("tasks", []):
                        tags = {t.get("key"): t.get("value") for t in task.get("tags", [])}
                        if tags.get(tag_key) == tag_value:
                            found.append(task)
        return found

    def describe_container_instance(self, container_instance: str) -> dict[str, Any] | None:
        """The instance as ECS describes it; None when ECS answers it MISSING (not registered
        with the cluster). Other failures are raised (:class:`EcsActionFailed`)."""
        response = self._ecs.describe_container_instances(
            cluster=self.cluster, containerInstances=[container_instance]
        )
        _unexpected_failures("DescribeContainerInstances", response)
        found = response.get("containerInstances", [])
        return found[0] if found else None

    def is_agent_connected(self, container_instance: str) -> bool | None:
        """ECS's ``agentConnected`` for one node, a token of the Describe budget taken first (a
        check per node may ask it: a burst of them keeps to the budget, the caller treating a
        refusal as no answer); None when ECS answers it MISSING."""
        self.describe_budget.acquire(1)
        node = self.describe_container_instance(container_instance)
        return None if node is None else bool(node.get("agentConnected"))

    def describe_container_instances(self, refs: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The given container instances (ARNs or ids) described, by 100: container instance
        id -> its description (one ECS does not know is absent: its ``failures`` say MISSING)."""
        found: dict[str, dict[str, Any]] = {}
        refs = list(dict.fromkeys(refs))
        for start in range(0, len(refs), 100):
            response = self._ecs.describe_container_instances(cluster=self.cluster,
                                                              containerInstances=refs[start:start + 100])
            for ci in response.get("containerInstances", []):
                found[str(ci["containerInstanceArn"]).rsplit("/", 1)[-1]] = ci
        return found

    def tasks_on(self, container_instance: str) -> list[dict[str, Any]]:
        """The live tasks on one container instance (ListTasks of that instance, whose default
        filter lists desired status RUNNING; DescribeTasks of the first 10): what holds it."""
        arns = self._ecs.list_tasks(cluster=self.cluster, containerInstance=container_instance,
                                    maxResults=10).get("taskArns", [])
        if not arns:
            return []
        return list(self._ecs.describe_tasks(cluster=self.cluster, tasks=arns).get("tasks", []))

    def container_instances(self, statuses: Sequence[str | None] = (ecs_status.ACTIVE, ecs_status.DRAINING),
                            *, missing_ok: bool = True, query: str | None = None) -> list[dict[str, Any]]:
        """The cluster's container instances in ``statuses``, described
        (ListContainerInstances per status + DescribeContainerInstances by 100).

        The default (ACTIVE and DRAINING): the breaker counts the GPU nodes, relocation looks
        for healthy free ones (node actions only). ``("ACTIVE",)``: the scheduler's snapshot.
        ``(None,)``: no status filter, i.e. every registered instance but INACTIVE ones (the
        jobs API's capacity check). ``query``: a cluster query language ``filter`` (the
        instances registered since a time: a replacement the stack awaits).

        ``missing_ok=False``: an instance just listed that DescribeContainerInstances answers
        MISSING (ECS is eventually consistent) raises :class:`EcsActionFailed` instead of
        being left out, for a caller to whom a short count is worse than none (the breaker)."""
        arns: list[str] = []
        paginator = self._ecs.get_paginator("list_container_instances")
        for status in statuses:
            params: dict[str, Any] = {"cluster": self.cluster, "PaginationConfig": {"PageSize": 100}}
            if status is not None:
                params["status"] = status
            if query:
                params["filter"] = query
            for page in paginator.paginate(**params):
                arns.extend(page.get("containerInstanceArns", []))
        described: list[dict[str, Any]] = []
        for start in range(0, len(arns), 100):
            response = self._ecs.describe_container_instances(
                cluster=self.cluster, containerInstances=arns[start:start + 100])
            _unexpected_failures("DescribeContainerInstances", response)  # MISSING: deregistered since
            if not missing_ok and response.get("failures"):
                raise EcsActionFailed("DescribeContainerInstances", response["failures"])
            described.extend(response.get("containerInstances", []))
        return described

    def put_attributes(self, container_instance: str, attributes: Mapping[str, str]) -> bool:
        """PutAttributes: custom attributes (name -> value, "" for a name only) on one
        container instance, in one call (idempotent). False when ECS no longer knows the
        instance (deregistered); :class:`AttributeLimitExceeded` when it has no room."""
        targets = [{"name": name, **({"value": value} if value else {})}
                   for name, value in attributes.items()]
        return self._attribute_call(self._ecs.put_attributes, container_instance, targets)

    def delete_attributes(self, container_instance: str, names: Sequence[str]) -> bool:
        """DeleteAttributes: names and target, no value (as ECS documents for custom
        attributes), in one call. False when ECS no longer knows the instance."""
        return self._attribute_call(self._ecs.delete_attributes, container_instance,
                                    [{"name": name} for name in names])

    def put_attributes_many(self, entries: Sequence[tuple[str, str, str]]) -> set[str]:
        """PutAttributes of one custom attribute on each of many container instances
        (``(instance, name, value)``), up to 10 attributes a call (ECS's limit per call), each
        with its own target. Returns the instances ECS no longer knows (each asked alone once
        a call naming one was refused)."""
        return self._attributes_many(self._ecs.put_attributes, [
            (target, {"name": name, **({"value": value} if value else {})})
            for target, name, value in entries])

    def delete_attributes_many(self, entries: Sequence[tuple[str, str]]) -> set[str]:
        """DeleteAttributes of ``(instance, name)`` pairs, up to 10 a call; the instances ECS no
        longer knows."""
        return self._attributes_many(self._ecs.delete_attributes,
                                     [(target, {"name": name}) for target, name in entries])

    def _attributes_many(self, call: Any, entries: list[tuple[str, dict[str, str]]]) -> set[str]:
        gone: set[str] = set()
        for start in range(0, len(entries), ATTRIBUTES_PER_CALL):
            chunk = entries[start:start + ATTRIBUTES_PER_CALL]
            self._take_token()
            try:
                call(cluster=self.cluster, attributes=[{**a, **_target(t)} for t, a in chunk])
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") != "TargetNotFoundException":
                    raise
                for target, attribute in chunk:  # which one is gone: each alone
                    if not self._attribute_call(call, target, [attribute]):
                        gone.add(target)
        return gone

    def _attribute_call(self, call: Any, container_instance: str, attributes: list[dict[str, str]]) -> bool:
        extra = _target(container_instance)
        self._take_token()
        try:
            call(cluster=self.cluster, attributes=[{**a, **extra} for a in attributes])
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            if code == "AttributeLimitExceededException":
                raise AttributeLimitExceeded(container_instance) from error
            if code != "TargetNotFoundException":
                raise
            logger.info("attribute call on a container instance ECS no longer knows",
                        extra={"container_instance": container_instance})
            return False
        return True

    def drain(self, container_instance_arn: str) -> str:
        """Quarantine: DRAINING keeps ECS from placing new tasks on the instance. Returns
        "draining" once ECS answered without a failure for it, or "deregistered" when ECS
        answered MISSING or INACTIVE and DescribeContainerInstances agrees (the instance is
        not registered: nothing can be placed on it). Any other failure (or a MISSING the
        instance's description contradicts: ECS not caught up) raises
        :class:`EcsActionFailed`: not drained, the caller tries again."""
        self._take_token()
        response = self._ecs.update_container_instances_state(
            cluster=self.cluster, containerInstances=[container_instance_arn], status=ecs_status.DRAINING
        )
        failures = response.get("failures") or []
        if not failures:
            return "draining"
        if all(f.get("reason") in (MISSING, ecs_status.INACTIVE) for f in failures):
            described = self.describe_container_instance(container_instance_arn)
            if described is None or described.get("status") == ecs_status.INACTIVE:
                logger.warning("drain of a container instance ECS no longer has registered",
                               extra={"container_instance": container_instance_arn, "failures": failures})
                return "deregistered"
        raise EcsActionFailed("UpdateContainerInstancesState", failures)


def _target(container_instance: str) -> dict[str, str]:
    """An attribute's target: the ARN, or the short id with its type."""
    extra: dict[str, str] = {"targetId": container_instance}
    if not container_instance.startswith("arn:"):
        extra["targetType"] = "container-instance"  # the short id needs its type
    return extra
