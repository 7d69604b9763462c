"""The one world builder, :func:`build_world`: every local app, scenario, campaign, bench
and test enters a simulated world through it. Two worlds share the simulation layer
(``local_mode.sim``: one ECS model, one event bus, one SQS queue model, the deployment's
wiring in ``sim.wiring``) and differ in their storage and timing:

* ``backend="moto"`` (the default): :class:`World`, the emulated AWS account (``LocalAws``:
  moto, or its in-memory DynamoDB), the bus delivering in process and the simulated ECS data
  plane (``SimulatedEcs``), with the recovery Lambdas wired to the bus as infra deploys them;
  exact API behaviour, for the demo, the playground, the scenarios and the campaigns. Its
  DynamoDB is ``LocalAws(dynamodb=...)``'s, by default :data:`DEFAULT_DYNAMODB` (moto for the
  demo and the playground; the test suite sets the in-memory store, a fraction of moto's CPU
  per call, and the tests that pin moto's DynamoDB ask for it)::

    with build_world(duplicate_delivery=True, max_recovery_attempts=3) as world:
        world.ecs.add_node("node-a")
        ...
        world.ecs.run_for(3600)

* ``backend="scale"``: :class:`~local_mode.scale_recovery.ScaleWorld`, the timed engine, the
  in-memory DynamoDB, the ECS cluster's control plane and Lambda's concurrency, for
  thousands of ranks (the scale bench)::

    with build_world(backend="scale", seed=3, sweep_every_seconds=None) as world:
        ...

The handlers' services (``runtime``) are forgotten right after the emulator starts and
again before it stops: a handler never runs on services built for another emulator.
Apps that also serve the jobs API wrap the world in ``harness.reset_handler_caches``
(before the emulator and after it), which drops the jobs API's own caches too.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

from gpu_recovery import constants as C
from gpu_recovery import runtime
from gpu_recovery.repository import Repository

from .emulator import LocalAws
from .events import ACCOUNT_ID
from .sim import deployment as D
from .sim.bus import EventBus, Target
from .sim.ecs import SimulatedEcs
from .sim.lambda_context import LambdaContext
from .sim.wiring import InProcessHost, wire_recovery_handlers, wire_schedule

if TYPE_CHECKING:
    from .scale_recovery import ScaleWorld

#: the DynamoDB of a world that names none (``LocalAws(dynamodb=...)``): "moto", or "memory" (the
#: test suite's, tests/conftest.py)
DEFAULT_DYNAMODB = "moto"

#: the deployed rate(1 minute) schedules of the heartbeat sweep and the queue scheduler
HEARTBEAT_SWEEP_SCHEDULE = D.HEARTBEAT_SWEEP_SCHEDULE.name
QUEUE_SCHEDULER_SCHEDULE = D.QUEUE_SCHEDULER_SCHEDULE.name


def user_arn(name: str) -> str:
    """IAM user ``name``'s ARN in the emulator's account (IAM ARNs name no region)."""
    return f"arn:aws:iam::{ACCOUNT_ID}:user/{name}"


@dataclass
class World:
    """One emulated account, its event bus and its simulated ECS data plane."""

    #: the emulated AWS account: tables, topic, cluster, handler environment, API hooks
    aws: LocalAws
    #: EventBridge rules and schedules, the gang queue; at-least-once delivery
    bus: EventBus
    #: the ECS data plane in simulated time: nodes, agents, tasks, faults
    ecs: SimulatedEcs
    #: the recovery Lambdas wired to the bus, by name (empty when built without handlers)
    handlers: dict[str, Target] = field(default_factory=dict)
    #: the ARN of the training task definition ``build_world(training_family=...)`` registered
    training_task_definition: str = ""

    # --- what the stack wrote (through a Repository on the emulator's tables) ----------------
    _repo: tuple[int, Repository] | None = field(default=None, init=False, repr=False)

    @property
    def repo(self) -> Repository:
        # The handlers' shard count of the deadline index (their environment, set by the world):
        # the invariant and the campaigns read every shard the stack writes. Built once per
        # shard count (a Repository's boto3 Table resources cost milliseconds each).
        shards = int(os.environ.get(C.ENV_DEADLINE_INDEX_SHARDS) or 1)
        if self._repo is None or self._repo[0] != shards:
            self._repo = (shards, Repository(self.aws.resource("dynamodb"), self.aws.job_table,
                                             self.aws.instance_table, deadline_shards=shards))
        return self._repo[1]

    def job(self, job_id: str) -> dict[str, Any]:
        """The job item ({} if none)."""
        return self.repo.jobs.get_job_item(job_id) or {}

    def fault_records(self, job_id: str) -> dict[int, dict[str, dict[str, Any]]]:
        """attempt -> node -> the evidence and decision of that attempt's fault."""
        repo = self.repo
        job = repo.jobs.get_job(job_id)
        if job is None:
            return {}
        out = {attempt: repo.faults.records(job, attempt) for attempt in range(1, job.attempt + 1)}
        return {attempt: records for attempt, records in out.items() if records}

    def fault_record(self, job_id: str, attempt: int) -> dict[str, Any]:
        """The first node's record of the fault of ``attempt`` ({} if none)."""
        records = self.fault_records(job_id).get(attempt) or {}
        return next(iter(records.values())) if records else {}

    def node_item(self, name: str) -> dict[str, Any]:
        """The instance item of the simulated node ``name`` ({} if none)."""
        return self.repo.instances.get_instance_item(self.ecs.node(name).container_instance_id) or {}

    def node_name(self, ref: str) -> str:
        """The simulated node's name for an instance id or ARN (``ref`` itself if unknown)."""
        try:
            return str(self.ecs.node(ref).name)
        except KeyError:
            return ref

    def ranks_on(self, job_id: str) -> list[str]:
        """The nodes the job's training tasks run on now, sorted."""
        return sorted(t.node for t in self.ecs.running_tasks()
                      if not t.health_check and t.tags.get(C.TAG_JOB_ID) == job_id)

    def queue_cluster(self, nodes: Iterable[str]) -> str:
        """The queue scheduler on its minute schedule over ``nodes`` (8 GPUs each): the training
        task definition ("train", 8 GPUs) the jobs run."""
        self.schedule_queue_scheduler(60)
        for node in nodes:
            self.ecs.add_node(node, gpus=8)
        return self.ecs.register_training_task_definition("train", gpus=8)

    def submit_queue_job(self, spec: Mapping[str, Any], user: str) -> str:
        """``spec`` submitted to the job queue by IAM user ``user`` (the jobs API's service, no
        scheduler trigger: the scheduled tick admits it); its job id."""
        from gpu_recovery.adapters import aws
        from gpu_recovery.queue.jobs_api.service import JobQueueService
        from gpu_recovery.queue.jobs_api.triggers import NoSchedulerTrigger
        from gpu_recovery.queue.models import JobSpec

        service = JobQueueService(repo=self.repo, ecs_client=aws.client("ecs"),
                                  logs_client=aws.client("logs"), cluster=self.aws.cluster_name,
                                  scheduler=NoSchedulerTrigger())
        return str(service.submit(JobSpec.model_validate(dict(spec)), user_arn(user))["job_id"])

    def hold_training_stops(self) -> HeldStops:
        """From now on, the training tasks' STOPPED events are held back, by node, until
        ``HeldStops.deliver`` hands them to the task handler in the order a test chooses (as
        when a delivery dies and Lambda retries it after the others)."""
        return HeldStops(self)

    def schedule_heartbeat_sweep(self, every_seconds: float = 60) -> None:
        """The heartbeat sweep Lambda on its schedule, with its deployed async retries."""
        wire_schedule(self.bus, InProcessHost(self.bus), D.HEARTBEAT_SWEEP_SCHEDULE, every_seconds)

    def schedule_queue_scheduler(self, every_seconds: float = 60, *, target: Target | None = None) -> None:
        """The queue scheduler Lambda on its schedule, with its deployed async retries
        (``target``: the handler, wrapped)."""
        host = InProcessHost(self.bus)
        if target is not None:
            host.targets[D.QUEUE_SCHEDULER] = target
        wire_schedule(self.bus, host, D.QUEUE_SCHEDULER_SCHEDULE, every_seconds)

    def invoke_scheduler_in_process(self, on_failure: Callable[[Exception], None], *,
                                    target: Target | None = None) -> None:
        """The jobs API's asynchronous Invoke of the queue scheduler (after a submit, a
        cancel...), made in this process; a failure goes to ``on_failure``, never to the API
        call that triggered it (an async invoke's failure is not the caller's)."""
        from gpu_recovery.queue.jobs_api.triggers import CallbackSchedulerTrigger
        from handlers import jobs_api, queue_scheduler

        scheduler = target or queue_scheduler.lambda_handler

        guard = self.aws.grants

        def tick_now(payload: dict[str, Any]) -> None:
            if guard is not None:  # the deployed trigger: an asynchronous Invoke of the scheduler
                guard.check("lambda", "Invoke", {"FunctionName": "QueueScheduler", "InvocationType": "Event"})
            try:
                scheduler(payload, LambdaContext("queue_scheduler"))
            except Exception as error:  # an async invoke failure: reported, never raised
                on_failure(error)

        jobs_api.set_scheduler_trigger(CallbackSchedulerTrigger(tick_now))


class HeldStops:
    """The training tasks' STOPPED events held back by ``World.hold_training_stops``."""

    RULE = "training-task-state"

    def __init__(self, world: World) -> None:
        self._world = world
        self._rule = next(r for r in world.bus.rules if r.name == self.RULE)
        handler = self._rule.target
        assert handler is not None  # the in-process bus: each rule's target is its handler
        self._handler: Target = handler
        #: node name -> its last STOPPED event
        self.events: dict[str, dict[str, Any]] = {}
        self._rule.target = self._hold

    def _hold(self, event: dict[str, Any], context: Any) -> Any:
        if event["detail"]["lastStatus"] != "STOPPED":
            return self._handler(event, context)
        self.events[self._world.ecs.node(event["detail"]["containerInstanceArn"]).name] = event
        return {"held": True}

    def deliver(self, nodes: Iterable[str]) -> None:
        """The rule's handler back, then each held node's event handled in ``nodes``' order."""
        self._rule.target = self._handler
        for node in nodes:
            self._handler(copy.deepcopy(self.events[node]), LambdaContext(function_name="ecs_task_handler"))


@overload
def build_world(*, backend: Literal["moto"] = "moto", **options: Any) -> AbstractContextManager[World]: ...


@overload
def build_world(*, backend: Literal["scale"], **options: Any) -> ScaleWorld: ...


def build_world(*, backend: str = "moto", **options: Any) -> AbstractContextManager[World] | ScaleWorld:
    """A world of ``backend`` (see the module docstring), to enter with ``with``: ``options``
    go to :func:`build_moto_world` or to :class:`~local_mode.scale_recovery.ScaleWorld`
    (which is its own context manager)."""
    if backend == "moto":
        return build_moto_world(**options)
    if backend == "scale":
        from .scale_recovery import ScaleWorld

        return ScaleWorld(**options)
    raise ValueError(f"unknown world backend {backend!r} (moto, scale)")


@contextmanager
def build_moto_world(*, duplicate_delivery: bool = False, handlers: bool = True,
                sweep_every_seconds: float | None = 60, train_seconds: float | None = None,
                real_time_start: bool = False, sim_options: Mapping[str, Any] | None = None,
                training_family: str | None = None, training_run_seconds: float | None = None,
                **aws_options: Any) -> Iterator[World]:
    """Set up the moto world, yield it, tear it down.

    ``aws_options`` go to ``LocalAws`` (``metrics_disabled`` defaults to True here, ``dynamodb``
    to :data:`DEFAULT_DYNAMODB`);
    ``duplicate_delivery``: every event delivered twice; ``handlers``: wire the recovery
    Lambdas (``wire_recovery_handlers``), with the recovery sweep every
    ``sweep_every_seconds`` (None: no sweep schedule); ``train_seconds`` and
    ``sim_options`` go to ``SimulatedEcs`` (training ranks run until stopped by default);
    ``real_time_start``: simulated time starts at the wall-clock time the data plane is
    built (the playground, driven in real time), not at the fixed ``DEFAULT_START``;
    ``training_family``: register an 8-GPU training task definition of that family
    (``World.training_task_definition``) whose tasks run ``training_run_seconds`` then exit 0
    (None: until stopped).
    """
    aws_options = {"metrics_disabled": True, "dynamodb": DEFAULT_DYNAMODB, **aws_options}
    with LocalAws(**aws_options) as aws:
        runtime.reset(clients=False)
        try:
            bus = EventBus(duplicate_delivery=duplicate_delivery)
            options = dict(sim_options or {})
            if real_time_start:
                options["start"] = time.time()
            ecs = SimulatedEcs(aws, bus, train_seconds=train_seconds, **options)
            wired = (wire_recovery_handlers(bus, aws.cluster_arn, sweep_every_seconds=sweep_every_seconds)
                     if handlers else {})
            built = World(aws, bus, ecs, wired)
            if training_family is not None:
                built.training_task_definition = ecs.register_training_task_definition(training_family,
                                                                                        gpus=8)
                ecs.plan_family(training_family, run_seconds=training_run_seconds, exit_code=0)
            yield built
        finally:
            runtime.reset(clients=False)
