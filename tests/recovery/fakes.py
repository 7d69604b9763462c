"""In-memory fakes of the recovery loop's ports, and a world to drive its stages.

The repository is the real one on moto's DynamoDB (it is the DynamoDB adapter); ECS,
the reboot API, SNS and CloudWatch Logs are fakes that record every call, so a stage
test says exactly which side effects happened and how often.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError
from moto import mock_aws

from gpu_recovery import clock
from gpu_recovery import constants as C
from gpu_recovery.adapters.ecs import StartResult
from gpu_recovery.domain import latch
from gpu_recovery.domain.breaker import breaker
from gpu_recovery.domain.notifications import Notification
from gpu_recovery.domain.placement import UNAVAILABLE_ATTRIBUTE
from gpu_recovery.events.ecs import EcsContainerInstanceDetail, EcsTaskDetail
from gpu_recovery.recovery import RankRegistration, RecoveryService
from gpu_recovery.repository import Repository
from gpu_recovery.repository.base import DynamoGateway, Update
from gpu_recovery.settings import Settings
from local_mode.sim.contract.requests import RequestGuard
from local_mode.sim.contract.state import MotoState, key_schemas
from local_mode.sim.dynamo import MemoryDynamo
from local_mode.sim.dynamo.botocore_backend import serve_dynamodb_from

EVENTS = Path(__file__).resolve().parents[1] / "events"
REGION, ACCOUNT, CLUSTER = "us-east-1", "111122223333", "gpu-cluster"
CLUSTER_ARN = f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{CLUSTER}"


def event_time(at: float) -> str:
    """An epoch time as ECS events write theirs."""
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def ci_arn(node: str) -> str:
    return f"arn:aws:ecs:{REGION}:{ACCOUNT}:container-instance/{CLUSTER}/{node}"


@dataclass
class FakeTask:
    arn: str
    node: str
    started_by: str
    group: str
    last_status: str = "RUNNING"
    exit_code: int | None = None
    stop_code: str = ""
    stopped_reason: str = ""
    stopped_at: float | None = None
    task_definition: str = ""  # as StartTask was given it: a family or an ARN
    # ECS's createdAt / startedAt: set for the stack's own tasks (StartTask runs them at once);
    # a test makes one late (pending, or started after its node came back) by changing them.
    created_at: float | None = None
    started_at: float | None = None

    @property
    def task_definition_arn(self) -> str:
        """As ECS names it in the task's events and in DescribeTasks."""
        if not self.task_definition or self.task_definition.startswith("arn:"):
            return self.task_definition
        return f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/{self.task_definition}:1"


class LostResponse(BotoCoreError):
    """The call executed; its answer never came back (botocore raises a ``ReadTimeoutError``,
    a ``BotoCoreError``, once its own retries are spent, as the simulator's lost answer does)."""

    fmt = "{message}"

    def __init__(self, message: str) -> None:
        super().__init__(message=message)


def throttled(operation: str) -> Exception:
    """ECS's answer to a call over its rate, as botocore raises it."""
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"},
                        "ResponseMetadata": {"HTTPStatusCode": 400}}, operation)


def throttle_once(patch: Any, owner: type, name: str, operation: str,
                  armed: Callable[[], bool] = lambda: True) -> list[str]:
    """The first call of ``owner.name`` made while ``armed()`` holds raises ``operation``'s
    throttle (nothing done); every other call does what it did. ``patch`` is pytest's
    monkeypatch; the list returned holds the operation once the throttle was raised."""
    real, thrown = getattr(owner, name), []

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not thrown and armed():
            thrown.append(operation)
            raise throttled(operation)
        return real(self, *args, **kwargs)

    patch.setattr(owner, name, broken)
    return thrown


class CountedCalls:
    """Counts calls of some methods of an object (a repository's reads, say), by name, in
    order; each still does what it did."""

    def __init__(self, target: Any, names: Sequence[str]) -> None:
        self.calls: list[str] = []
        for name in names:
            setattr(target, name, self._counted(name, getattr(target, name)))

    def _counted(self, name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return real(*args, **kwargs)
        return call


@dataclass
class FakeEcs:
    cluster: str = CLUSTER
    tasks: dict[str, FakeTask] = field(default_factory=dict)
    stop_calls: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    agent_connected: dict[str, bool] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    #: fail the next call of an operation: ("refuse" | "lose" | "place_nothing")
    failures: dict[str, list[str]] = field(default_factory=dict)
    spare_nodes: list[str] = field(default_factory=list)
    start_calls: list[int] = field(default_factory=list)  # instances per StartTask call
    networks: list[dict[str, Any] | None] = field(default_factory=list)  # networkConfiguration per call
    prepaid: int = 0
    described: list[str] = field(default_factory=list)  # DescribeContainerInstances, one node each
    attributes: dict[str, set[str]] = field(default_factory=dict)  # node -> custom attributes
    attribute_values: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> name -> value
    attribute_calls: list[tuple[str, str, str]] = field(default_factory=list)
    #: the holds' batched attribute calls (put_attributes_many / delete_attributes_many)
    hold_calls: list[tuple[str, str, str]] = field(default_factory=list)
    #: nodes the batched puts may still mark before ECS throttles them (None: no limit)
    hold_puts_left: int | None = None
    cluster_listings: int = 0  # ListContainerInstances (+ Describe) rounds
    fail_listing: Exception | None = None  # raised by every listing while set (a throttled ECS)
    #: what DescribeTasks / DescribeContainerInstances answer MISSING (in ``failures``) while set
    missing_tasks: set[str] = field(default_factory=set)
    missing_nodes: set[str] = field(default_factory=set)
    #: nodes DescribeContainerInstances answers INACTIVE (deregistered)
    deregistered_nodes: set[str] = field(default_factory=set)
    #: node -> the task another scheduler runs on it (DescribeContainerInstances says it is busy)
    taken: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: node -> when it registered (a ``registeredAt >= <date>`` listing filters on it; others: 0)
    registered: dict[str, float] = field(default_factory=dict)
    #: running tasks as ListTasks + DescribeTasks describe them with their tags (the tag look-up)
    tagged_tasks: list[dict[str, Any]] = field(default_factory=list)
    tag_lookups: int = 0

    def _fault(self, operation: str) -> str | None:
        queue = self.failures.get(operation) or []
        return queue.pop(0) if queue else None

    def start_task(self, *, task_definition: str, container_instance_arn: str = "",
                   overrides: dict[str, Any] | None = None, tags: list[dict[str, str]] | None = None,
                   started_by: str = "", group: str | None = None,
                   container_instance_arns: Sequence[str] = (),
                   network_configuration: dict[str, Any] | None = None) -> StartResult:
        instances = list(container_instance_arns) or [container_instance_arn]
        self.start_calls.append(len(instances))
        self.networks.append(network_configuration)
        fault = self._fault("start_task")
        if fault == "refuse":
            raise throttled("StartTask")
        if fault == "place_nothing":
            return StartResult([], [{"arn": a, "reason": "RESOURCE:GPU"} for a in instances])
        placed = {}
        for instance in instances:
            arn = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/{CLUSTER}/{uuid.uuid4().hex}"
            self.tasks[arn] = FakeTask(arn, instance.rsplit("/", 1)[-1], started_by, group or "",
                                       task_definition=task_definition, created_at=clock.now(),
                                       started_at=clock.now())
            placed[ci_arn(instance.rsplit("/", 1)[-1])] = arn
        if fault == "lose":
            raise LostResponse("StartTask: response lost")
        return StartResult(list(placed.values()), [], placed)

    def stop_task(self, task_arn: str, reason: str) -> None:
        if self._fault("stop_task") == "refuse":
            raise throttled("StopTask")
        self.stop_calls.append(task_arn)

    def stop_task_before_deadline(self, task_arn: str, reason: str) -> None:
        self.stop_task(task_arn, reason)

    def prepay(self, calls: int, *, in_turn_within: float | None = None) -> None:
        # A turn (the DCGM start's) too far off at the budget:
        if in_turn_within is not None and self._fault("prepay_in_turn") == "rate_limited":
            from gpu_recovery.adapters.ecs_budget import RateLimited

            raise RateLimited(7.0)
        self.prepaid += calls

    def describe_tasks(self, task_arns: Sequence[str]) -> list[dict[str, Any]]:
        return [t for t in (self.describe_task(a) for a in task_arns) if t is not None]

    def describe_task(self, task_arn: str) -> dict[str, Any] | None:
        if self._fault("describe_task") == "refuse":
            raise throttled("DescribeTasks")
        task = self.tasks.get(task_arn)
        if task is None or task_arn in self.missing_tasks:
            return None
        times = {name: datetime.fromtimestamp(at, tz=UTC) for name, at in (
            ("stoppedAt", task.stopped_at), ("createdAt", task.created_at), ("startedAt", task.started_at))
            if at is not None}
        return {**times, "taskArn": task.arn, "clusterArn": CLUSTER_ARN, "lastStatus": task.last_status,
                "containerInstanceArn": ci_arn(task.node), "startedBy": task.started_by,
                "group": task.group, "stopCode": task.stop_code, "stoppedReason": task.stopped_reason,
                "taskDefinitionArn": task.task_definition_arn,
                "containers": [{"name": "dcgm", "exitCode": task.exit_code}], "tags": []}

    def tasks_started_by(self, started_by: str) -> list[str]:
        if self._fault("tasks_started_by") == "refuse":
            raise throttled("ListTasks")
        return [t.arn for t in self.tasks.values() if t.started_by == started_by]

    def stopped_task_started_by(self, container_instance: str, started_by: str) -> dict[str, Any] | None:
        return next((self.describe_task(t.arn) for t in self.tasks.values() if t.started_by == started_by
                     and t.node == container_instance and t.last_status == "STOPPED"), None)

    def unavailable(self, node: str) -> str | None:
        """The node's placement attribute (``gpu-recovery.unavailable``): its value, or None."""
        return self.attribute_values.get(node, {}).get(UNAVAILABLE_ATTRIBUTE)

    def tasks_tagged(self, tag_key: str, tag_value: str) -> list[dict[str, Any]]:
        self.tag_lookups += 1
        tag = {"key": tag_key, "value": tag_value}
        return [t for t in self.tagged_tasks if tag in t["tags"]]

    def describe_container_instance(self, container_instance: str) -> dict[str, Any] | None:
        node = container_instance.rsplit("/", 1)[-1]
        self.described.append(node)
        if node in self.missing_nodes:
            return None
        return {"containerInstanceArn": ci_arn(node),
                "status": "INACTIVE" if node in self.deregistered_nodes else "ACTIVE",
                "agentConnected": self.agent_connected.get(node, True),
                "version": self.versions.get(node, 1), "ec2InstanceId": f"i-{node}"}

    def is_agent_connected(self, container_instance: str) -> bool | None:
        node = self.describe_container_instance(container_instance)
        return None if node is None else bool(node["agentConnected"])

    def drain(self, container_instance_arn: str) -> str:
        fault = self._fault("drain")
        if fault == "refuse":
            raise throttled("UpdateContainerInstancesState")
        self.drained.append(container_instance_arn)
        if fault == "lose":
            raise LostResponse("UpdateContainerInstancesState: response lost")
        return "draining"

    def put_attributes(self, container_instance: str, attributes: Mapping[str, str]) -> bool:
        """PutAttributes: the attributes on the node (``attributes``, values in
        ``attribute_values``), one record per attribute in ``attribute_calls``."""
        fault = self._fault("put_attributes")
        if fault == "refuse":
            raise throttled("PutAttributes")
        if fault == "no_room":  # the node carries 10 custom attributes of its users' (as EcsAdapter says)
            from gpu_recovery.adapters.ecs import AttributeLimitExceeded

            raise AttributeLimitExceeded(container_instance)
        node = container_instance.rsplit("/", 1)[-1]
        for name, value in attributes.items():
            self.attribute_calls.append(("put", node, name))
            self.attributes.setdefault(node, set()).add(name)
            self.attribute_values.setdefault(node, {})[name] = value
        if fault == "lose":
            raise LostResponse("PutAttributes: response lost")
        return True

    def delete_attributes(self, container_instance: str, names: Sequence[str]) -> bool:
        node = container_instance.rsplit("/", 1)[-1]
        for name in names:
            self.attribute_calls.append(("delete", node, name))
            self.attributes.get(node, set()).discard(name)
            self.attribute_values.get(node, {}).pop(name, None)
        return True

    def put_attributes_many(self, entries: Sequence[tuple[str, str, str]]) -> set[str]:
        """The holds' batched PutAttributes (spare, reserved): values in ``attribute_values``,
        calls in ``hold_calls`` (``attribute_calls`` keeps the cordons' own, one node a call);
        ``failures["put_attributes_many"]`` breaks them ("refuse": a throttle)."""
        if self._fault("put_attributes_many") == "refuse":
            raise throttled("PutAttributes")
        for target, name, value in entries:
            if self.hold_puts_left is not None:
                if self.hold_puts_left <= 0:  # a later call of the adapter's 10-node calls throttled
                    raise throttled("PutAttributes")
                self.hold_puts_left -= 1
            node = target.rsplit("/", 1)[-1]
            self.hold_calls.append(("put", node, name))
            self.attributes.setdefault(node, set()).add(name)
            self.attribute_values.setdefault(node, {})[name] = value
        return set()

    def delete_attributes_many(self, entries: Sequence[tuple[str, str]]) -> set[str]:
        for target, name in entries:
            node = target.rsplit("/", 1)[-1]
            self.hold_calls.append(("delete", node, name))
            self.attributes.get(node, set()).discard(name)
            self.attribute_values.get(node, {}).pop(name, None)
        return set()

    def container_instances(self, statuses: Sequence[str | None] = ("ACTIVE", "DRAINING"), *,
                            missing_ok: bool = True, query: str | None = None) -> list[dict[str, Any]]:
        """Every node a task ran on (plus ``spare_nodes``), 8 GPUs each, free unless busy
        (``query``: only ``registeredAt >= <date>``, on ``registered``)."""
        self.cluster_listings += 1
        if self.fail_listing is not None:
            raise self.fail_listing
        nodes = sorted({t.node for t in self.tasks.values()} | set(self.spare_nodes))
        if query and query.startswith("ec2InstanceId in ["):  # AWS's notices (recovery.aws_notices)
            wanted = {v.strip().strip("'") for v in query.removeprefix("ec2InstanceId in [")[:-1].split(",")}
            nodes = [n for n in nodes if f"i-{n}" in wanted]
        elif query:
            since = datetime.strptime(query.removeprefix("registeredAt >= "), "%Y-%m-%dT%H:%M:%SZ")
            nodes = [n for n in nodes if self.registered.get(n, 0.0) >= since.replace(tzinfo=UTC).timestamp()]
        out = []
        for node in nodes:
            busy = any(t.node == node and t.last_status == "RUNNING" for t in self.tasks.values())
            gpu = lambda n: [{"name": "GPU", "type": "STRINGSET",  # noqa: E731
                              "stringSetValue": [f"GPU-{i}" for i in range(n)]}]
            out.append({"containerInstanceArn": ci_arn(node), "status": "ACTIVE",
                        "agentConnected": self.agent_connected.get(node, True),
                        "ec2InstanceId": f"i-{node}", "registeredResources": gpu(8),
                        "remainingResources": gpu(0 if busy else 8)})
        return out

    def describe_container_instances(self, refs: Sequence[str]) -> dict[str, dict[str, Any]]:
        """ACTIVE, agent as ``agent_connected`` says, every GPU free but on ``taken`` nodes."""
        out = {}
        for ref in refs:
            node = ref.rsplit("/", 1)[-1]
            gpu = lambda n: [{"name": "GPU", "type": "STRINGSET",  # noqa: E731
                              "stringSetValue": [f"GPU-{i}" for i in range(n)]}]
            out[node] = {"containerInstanceArn": ci_arn(node), "status": "ACTIVE",
                         "agentConnected": self.agent_connected.get(node, True), "ec2InstanceId": f"i-{node}",
                         "registeredResources": gpu(8),
                         "remainingResources": gpu(0 if node in self.taken else 8)}
        return out

    def tasks_on(self, container_instance: str) -> list[dict[str, Any]]:
        task = self.taken.get(container_instance.rsplit("/", 1)[-1])
        return [task] if task else []

    def health_checks_on(self, node: str) -> list[FakeTask]:
        return [t for t in self.tasks.values() if t.node == node and t.group == C.HEALTH_CHECK_GROUP]


@dataclass
class FakeRebooter:
    calls: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "refuse" | "lose"

    def reboot(self, instance_id: str, reason: str) -> str:
        fault = self.failures.pop(0) if self.failures else None
        if fault == "refuse":
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "RebootInstances")
        self.calls.append(instance_id)
        if fault == "lose":
            raise LostResponse("RebootInstances: response lost")
        return "ec2"


@dataclass
class FakeReplacer:
    """Auto Scaling: every i- node in a group, InService until terminated."""

    terminated: list[str] = field(default_factory=list)
    fail_next: str = ""  # "lose": the call executes, its answer is lost

    def groups_of(self, instance_ids: list[str]) -> dict[str, tuple[str, str]]:
        return {i: ("Terminating" if i in self.terminated else "InService", "gpu-nodes")
                for i in instance_ids if i.startswith("i-")}

    def terminate_in_asg(self, instance_id: str) -> str:
        self.terminated.append(instance_id)
        if self.fail_next == "lose":
            self.fail_next = ""
            raise LostResponse("TerminateInstanceInAutoScalingGroup: response lost")
        return "terminating in gpu-nodes"


@dataclass
class FakeNotifier:
    sent: list[Notification] = field(default_factory=list)

    def publish(self, notification: Notification) -> str:
        self.sent.append(notification)
        return str(len(self.sent))


class FakeVerdicts:
    def read_verdict(self, task_arn: str) -> dict[str, Any] | None:
        return {"verdict": "reboot", "failed_tests": ["memory"]}


class Flaky:
    """Wraps the repository: the named intent executes, then raises (lost response),
    or raises without executing (refused), once."""

    def __init__(self, repo: Any, faults: dict[str, str] | None = None, prefix: str = "",
                 parent: Flaky | None = None) -> None:
        self._repo = repo
        self._faults: dict[str, str] = {} if faults is None else faults
        self._prefix = prefix
        self._parent = parent  # the repository's wrapper, for an aggregate's

    def fail_once(self, intent: str, how: str) -> None:
        self._faults[intent] = how

    def armed(self) -> list[str]:
        """The faults armed and not fired yet."""
        return sorted(self._faults)

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._repo, name)
        key = self._prefix + name
        if not self._prefix and _is_aggregate(real):
            # The aggregates the stages are handed on their own: their intents are named
            # "breaker.save", "jobs.finish_job"... One wrapper each, kept: the stages and the
            # test patch the same object.
            wrapped = self.__dict__[name] = Flaky(real, self._faults, f"{name}.", self)
            return wrapped
        parent = self._parent
        if parent is not None and _is_aggregate(real) and getattr(parent._repo, name, None) is real:
            # The tables' aggregates reached through another (``repo.instances.cordons`` is
            # ``repo.cordons``): the repository's one wrapper of it.
            return getattr(parent, name)
        if not callable(real) or key not in self._faults:
            return real

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            how = self._faults.pop(key, None)
            if how == "refuse":
                raise TimeoutError(f"{name}: throttled (injected)")
            result = real(*args, **kwargs)
            if how == "lose":
                raise LostResponse(f"{name}: response lost (injected)")
            return result

        return wrapper


def _is_aggregate(attribute: Any) -> bool:
    """An object of the repository package the repository carries (``repo.breaker``,
    ``repo.decisions``...), not its gateway (``db``)."""
    module = type(attribute).__module__
    return module.startswith("gpu_recovery.repository.") and not isinstance(attribute, DynamoGateway)


@dataclass
class FakeQueue:
    """The gang fan-out's queue: what was sent (body, visible at), in order."""

    now: list[float]
    messages: list[tuple[dict[str, Any], float]] = field(default_factory=list)
    sends: int = 0
    fail_next: int = 0  # the next sends raise (SQS unreachable), nothing sent

    def send(self, bodies: Sequence[Any], delay_seconds: int = 0) -> None:
        if self.fail_next > 0:
            self.fail_next -= 1
            raise RuntimeError("SendMessageBatch: connection reset")
        self.sends += 1
        self.messages += [(dict(b), self.now[0] + delay_seconds) for b in bodies]


@dataclass
class World:
    service: RecoveryService
    repo: Any
    ecs: FakeEcs
    rebooter: FakeRebooter
    notifier: FakeNotifier
    now: list[float]
    replacer: FakeReplacer = field(default_factory=FakeReplacer)
    queue: FakeQueue | None = None

    def advance(self, seconds: float) -> None:
        self.now[0] += seconds

    def drain_queue(self, *, receive_count: int = 1) -> int:
        """Run every visible batch on the queue (as the worker would), oldest first."""
        assert self.queue is not None
        ran = 0
        while True:
            due = [m for m in self.queue.messages if m[1] <= self.now[0]]
            if not due:
                return ran
            self.queue.messages.remove(due[0])
            self.service.on_gang_batch(due[0][0], receive_count=receive_count)
            ran += 1

    def trip_breaker(self, nodes: list[str]) -> None:
        """``nodes`` already rebooted in the breaker's window of a 2-GPU-node cluster (two
        trip it: the next node action is held)."""
        state = None
        for i, node in enumerate(nodes):
            decided = breaker.record_action(state, node=node, action="reboot", now=self.now[0] - 60 + i,
                                            cluster_gpu_nodes=2)
            assert self.repo.breaker.save(decided.state, None if state is None else state["version"])
            state = decided.state

    def register_job(self, job_id: str, nodes: list[str], attempt: int = 1,
                     tags: dict[str, str] | None = None) -> list[str]:
        arns = []
        for rank, node in enumerate(nodes):
            arn = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/{CLUSTER}/{job_id}{rank}{uuid.uuid4().hex[:8]}"
            self.ecs.tasks[arn] = FakeTask(arn, node, "gpujobs", "family:train")
            self.service.register_rank(RankRegistration(
                job_id=job_id, rank=rank, world_size=len(nodes), attempt=attempt, task_arn=arn,
                task_definition_arn=f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/train:1",
                container_instance_arn=ci_arn(node), ec2_instance_id=f"i-{node}",
                tags=[{"key": C.TAG_JOB_ID, "value": job_id}, {"key": C.TAG_RANK, "value": str(rank)},
                      {"key": C.TAG_WORLD_SIZE, "value": str(len(nodes))},
                      *({"key": k, "value": v} for k, v in (tags or {}).items())]))
            arns.append(arn)
        return arns

    def lose_registration(self, job_id: str, rank: int, node: str, world_size: int) -> str:
        """Rank ``rank`` of attempt 1 runs on ``node`` (its task, returned) but its RUNNING
        event was lost: no rank item, not arrived on the registered latch (nor its node), found
        only by its tags."""
        arn = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/{CLUSTER}/{job_id}{rank}-lost"
        self.ecs.tasks[arn] = FakeTask(arn, node, "gpujobs", "family:train")
        jobs = self.repo.tables.db.table(self.repo.tables.job_table_name)
        jobs.delete_item(Key={C.JOB_PK: C.rank_item_key(job_id, rank)})
        shard = latch.shard_of(rank)
        jobs.update_item(
            Key={C.JOB_PK: C.latch_shard_key(job_id, 1, shard)}, UpdateExpression="DELETE #r :rank, #n :node",
            ExpressionAttributeNames={"#r": latch.Latch.REGISTERED.value, "#n": "nodes"},
            ExpressionAttributeValues={":rank": {rank}, ":node": {node}})
        jobs.update_item(
            Key={C.JOB_PK: C.latch_head_key(job_id, 1)}, UpdateExpression="DELETE #s :shard",
            ExpressionAttributeNames={"#s": latch.Latch.REGISTERED.head_attribute},
            ExpressionAttributeValues={":shard": {shard}})
        self.ecs.tagged_tasks.append({
            "taskArn": arn, "containerInstanceArn": ci_arn(node),
            "taskDefinitionArn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/train:1",
            "tags": [{"key": C.TAG_JOB_ID, "value": job_id}, {"key": C.TAG_RANK, "value": str(rank)},
                     {"key": C.TAG_WORLD_SIZE, "value": str(world_size)}]})
        return arn

    def unavailable_at_stop(self, nodes: Sequence[str]) -> dict[str, dict[str, str | None]]:
        """Filled as tasks are stopped: each task's first StopTask -> ``nodes``' placement
        attribute (``gpu-recovery.unavailable``) at that moment (a reservation must come
        before the stop that frees its node)."""
        seen: dict[str, dict[str, str | None]] = {}
        real_stop = self.ecs.stop_task

        def stop_task(task_arn: str, reason: str) -> None:
            seen.setdefault(task_arn, {n: self.ecs.unavailable(n) for n in nodes})
            real_stop(task_arn, reason)

        self.ecs.stop_task = stop_task  # type: ignore[method-assign]
        return seen

    def register_queue_job(self, job_id: str, nodes: list[str]) -> list[str]:
        """A queue job (the control channel: it can be asked to checkpoint) running on ``nodes``."""
        arns = self.register_job(job_id, nodes)
        self.repo.tables.db.apply(Update(table="jobs", key={C.JOB_PK: C.job_item_key(job_id)}, set_fields={
            "source": "queue", "priority": 10, "submitted_at": self.now[0] - 600,
            "job_state": C.JobState.RUNNING.value}))
        return arns

    def stopped_by_the_stack(self, arns: list[str]) -> None:
        """Every rank's STOPPED event after the stack's StopTask (a suspend's, a move's, the
        job's end); a delivery whose answer is lost counts as delivered."""
        for arn in arns:
            with suppress(LostResponse):
                self.service.on_task_state_change(self.task_stopped(
                    arn, exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspended"))

    def task_stopped(self, task_arn: str, *, exit_code: int | None,
                     stop_code: str = "EssentialContainerExited",
                     reason: str = "Essential container in task exited") -> EcsTaskDetail:
        """The STOPPED event of a training task, from the AWS-shaped fixture."""
        task = self.ecs.tasks[task_arn]
        task.last_status, task.exit_code, task.stop_code, task.stopped_reason = "STOPPED", exit_code, \
            stop_code, reason
        event = copy.deepcopy(json.loads((EVENTS / "training_task_stopped_exit1.json").read_text()))
        detail = event["detail"]
        detail.update(taskArn=task_arn, clusterArn=CLUSTER_ARN, containerInstanceArn=ci_arn(task.node),
                      stopCode=stop_code, stoppedReason=reason, startedBy=task.started_by, group=task.group)
        detail["containers"][0]["exitCode"] = exit_code
        # The event is as recent as the world's clock, so node evidence (XIDs) reported
        # "now" falls inside the fault's window as it would in a live cluster.
        stamp = event_time(self.now[0])
        detail.update(stoppingAt=stamp, stoppedAt=stamp, executionStoppedAt=stamp, updatedAt=stamp)
        if task.started_at is not None:  # a task the stack started: when it really ran
            detail["startedAt"] = event_time(task.started_at)
        return EcsTaskDetail.model_validate(detail)

    def task_running(self, task_arn: str, node: str, at: float) -> EcsTaskDetail:
        """A training task's RUNNING event (the AWS documentation's example), at ``at``."""
        detail = json.loads((EVENTS / "aws_doc_ecs_task_state_change.json").read_text())["detail"]
        stamp = event_time(at)
        detail.update(taskArn=task_arn, clusterArn=CLUSTER_ARN, containerInstanceArn=ci_arn(node),
                      group="gpujobs", updatedAt=stamp)
        return EcsTaskDetail.model_validate(detail)

    def health_check_stopped(self, task: FakeTask, exit_code: int) -> EcsTaskDetail:
        task.last_status, task.exit_code, task.stopped_at = "STOPPED", exit_code, self.now[0]
        event = json.loads((EVENTS / "health_check_task_stopped.json").read_text())
        detail = event["detail"]
        stamp = event_time(self.now[0])
        detail.update(taskArn=task.arn, clusterArn=CLUSTER_ARN, containerInstanceArn=ci_arn(task.node),
                      startedBy=task.started_by, stoppingAt=stamp, stoppedAt=stamp, updatedAt=stamp,
                      taskDefinitionArn=task.task_definition_arn)
        detail["containers"][0]["exitCode"] = exit_code
        return EcsTaskDetail.model_validate(detail)

    def instance_event(self, node: str, *, connected: bool, version: int,
                       at: float, agent: str = "") -> EcsContainerInstanceDetail:
        event = json.loads((EVENTS / "aws_doc_ecs_container_instance_state_change.json").read_text())
        detail = event["detail"]
        from datetime import UTC, datetime

        detail.update(containerInstanceArn=ci_arn(node), clusterArn=CLUSTER_ARN, agentConnected=connected,
                      status="ACTIVE", version=version,
                      updatedAt=datetime.fromtimestamp(at, tz=UTC).isoformat())
        if agent:  # the ECS agent's version (it changes when the agent is updated)
            detail["versionInfo"] = {**detail.get("versionInfo", {}), "agentVersion": agent}
        return EcsContainerInstanceDetail.model_validate(detail)


#: the stage worlds' DynamoDB: the in-memory store, as the emulator's worlds (tests/conftest.py);
#: "moto" under tests/repository (its conftest.py says why)
DYNAMODB = "memory"


@contextmanager
def dynamodb_of_the_world() -> Iterator[None]:
    """Every DynamoDB client and resource boto3's default session makes meanwhile (the world's
    repository and a test's own reads) answered by one in-memory store (``DYNAMODB ==
    "memory"``): moto's DynamoDB took about three quarters of these tests' CPU (its update
    expressions' validation, whole tables copied for each transaction), the store a fraction
    of it; the two give the same answers (tests/local_mode/test_memory_backend.py)."""
    if DYNAMODB != "memory":
        yield
        return
    session = boto3._get_default_session()
    store = MemoryDynamo(tx_conflict_window=0, arn_prefix=f"arn:aws:dynamodb:{REGION}:{ACCOUNT}")
    serve_dynamodb_from(session, store)  # sets the session's client and resource factories
    try:
        yield
    finally:
        del session.client, session.resource  # the class's own again


@contextmanager
def world(*, gang_queue: bool = False, verdicts: Any = None, tag_lookups: Any = None,
          **settings: Any) -> Iterator[World]:
    """``verdicts``: the checks' verdict-line reader (FakeVerdicts); ``tag_lookups``: the tag
    lookup worker's queue (none)."""
    now = [1_800_000_000.0]
    with mock_aws(), dynamodb_of_the_world():
        ddb = boto3.resource("dynamodb", region_name=REGION)
        defs = C.table_definitions()
        for kind, name in (("job", "jobs"), ("instance", "instances")):
            ddb.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", **defs[kind])
        # The repository's requests held to what AWS accepts (issue 40; tests/conftest.py).
        tables = key_schemas({"jobs": defs["job"], "instances": defs["instance"]})
        RequestGuard(MotoState(ACCOUNT, REGION, tables)).install(ddb.meta.client)
        repo = Repository(ddb, "jobs", "instances")
        flaky = Flaky(repo)
        ecs, rebooter, notifier, replacer = FakeEcs(), FakeRebooter(), FakeNotifier(), FakeReplacer()
        queue = FakeQueue(now) if gang_queue else None
        service = RecoveryService(flaky, ecs, rebooter, notifier, verdicts or FakeVerdicts(),  # type: ignore[arg-type]
                                  Settings("jobs", "instances", CLUSTER, "gpu-health-check", "topic",
                                           **settings), replacer=replacer, gang_queue=queue,
                                  tag_lookups=tag_lookups(now) if tag_lookups else None)
        clock.set_clock(lambda: now[0], lambda seconds: now.__setitem__(0, now[0] + seconds))
        try:
            yield World(service, flaky, ecs, rebooter, notifier, now, replacer, queue)
            # A fault armed that no call reached (an intent renamed, a path not taken) would
            # leave its test passing on a failure that never happened.
            assert not flaky.armed(), f"injected faults never fired: {flaky.armed()}"
        finally:
            clock.reset_clock()


Step = Callable[[], Any]
