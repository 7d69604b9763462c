"""The recovery stack of ``infra/recovery.py`` and ``infra/gang.py`` in the scale simulator:
four functions fed by EventBridge rules with the deployed patterns (and the minute
schedule), and the gang fan-out's worker fed by its SQS queue (batch size 1, partial batch
responses, the deployed maximum concurrency, visibility timeout and redrive to a DLQ).
Each Lambda container holds its own ``RecoveryService`` over the real ``Repository``
(:class:`~local_mode.sim.dynamo.MemoryDynamo`) and the real adapters (``EcsAdapter``
with the stack's ``EcsCallBudget`` item, ``GangQueue``, ``RebootAdapter``,
``SnsNotifier``, ``VerdictLogReader``) on the stand-in clients of
``local_mode/sim/`` (``engine``, ``aws_calls``, ``ecs_cluster``, ``aws_stand_ins``, ``sqs``), built by
``gpu_recovery.runtime.build_recovery_service`` (what ``runtime.recovery_service`` builds a
Lambda's service with).

Each function runs its handler's body, ``handlers.<name>.handle`` (the one its
``lambda_handler`` runs in Lambda: the same parsing, dropping of malformed events, logging
and partial batch responses), with the container's service instead of
``runtime.recovery_service``'s one service per process (which would share one ECS client
between concurrent invocations), and the invocation's remaining time, as Lambda's context
gives it (:func:`on_container`).

The rules, the schedule and the queues' event sources are put on the bus by
``local_mode.sim.wiring.wire_deployment``, the moto world's wiring too: :class:`ScaleWorld`
is its ``FunctionHost`` (a function is the engine's function of that name; a queue's event
source is Lambda's poller on its ``SqsQueue``). Build it with
``local_mode.world.build_world(backend="scale", ...)``.

Plugging in more (the fan-out the recovery loop will get):

* a **port** for the service: :attr:`ScaleWorld.service_factory` builds a container's
  service from its :class:`Ports` (``ports.queues[name]`` is a ``QueuePort`` on the queue
  ``name``);
* a **queue and its worker**: :meth:`ScaleWorld.add_queue` then :meth:`ScaleWorld.add_worker`
  with ``handle(container, body, receive_count)``;
* another **function**: ``world.lambdas.add_function`` and ``world.bus.add_rule`` /
  ``add_schedule``, with :meth:`ScaleWorld.container` as its container factory.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from gpu_recovery import clock as gr_clock
from gpu_recovery import constants as C
from gpu_recovery import runtime
from gpu_recovery.adapters.ecs import EcsAdapter
from gpu_recovery.adapters.ecs_budget import EcsCallBudget
from gpu_recovery.domain.validation import ValidationPolicy
from gpu_recovery.recovery import RecoveryService
from gpu_recovery.recovery.task_convention import container_environment
from gpu_recovery.settings import Settings
from handlers import (
    dcgm_task_monitor,
    ecs_instance_monitor,
    ecs_task_handler,
    gang_worker,
    recovery_sweep,
    tag_lookup_worker,
)
from handlers._common import Handle, run_body
from local_mode.health_verdicts import HEALTH_CHECK_LOG_GROUP
from local_mode.sim import deployment as D
from local_mode.sim.aws_calls import Account, Latencies
from local_mode.sim.aws_stand_ins import Ec2Client, LogsClient, SnsClient, SnsTopic, SsmClient
from local_mode.sim.bus import EventBus
from local_mode.sim.contract.requests import ContractViolation, RequestGuard
from local_mode.sim.contract.state import ClusterState, key_schemas
from local_mode.sim.contract.worlds import scale_guard
from local_mode.sim.dynamo import DEFAULT_TX_CONFLICT_WINDOW, MemoryDynamo, PartitionThroughput
from local_mode.sim.ecs_cluster import EcsCluster
from local_mode.sim.ecs_model import Node, Task
from local_mode.sim.engine import Simulation
from local_mode.sim.lambda_context import LambdaContext
from local_mode.sim.lambdas import EngineTiming, LambdaService
from local_mode.sim.sqs import POLL_DELAY_SECONDS, SimQueuePort, SqsQueue, sqs_batch_handler
from local_mode.sim.wiring import wire_deployment

JOB_TABLE = C.DEFAULT_JOB_TABLE_NAME
INSTANCE_TABLE = C.DEFAULT_INSTANCE_TABLE_NAME
# The functions, rules, schedule and queues are infra's (``local_mode.sim.deployment``); each
# function runs its handler module's ``handle``, the body its ``lambda_handler`` runs in Lambda.
HANDLES: dict[str, Handle] = {
    D.TASK_HANDLER: ecs_task_handler.handle,
    D.DCGM_MONITOR: dcgm_task_monitor.handle,
    D.INSTANCE_MONITOR: ecs_instance_monitor.handle,
    D.RECOVERY_SWEEP: recovery_sweep.handle,
    D.GANG_WORKER: gang_worker.handle,
    D.TAG_LOOKUP_WORKER: tag_lookup_worker.handle,
}
SWEEP_EVERY_SECONDS = D.SWEEP_SCHEDULE.every_seconds
GANG_QUEUE = D.GANG_QUEUE.name
TAG_LOOKUP_QUEUE = D.TAG_LOOKUP_QUEUE.name


class RecordingMetrics:
    """The service's metrics port: every metric added, summed by name."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.values[name] = self.values.get(name, 0) + value

    def add_metric_now(self, name: str, unit: str, value: float) -> None:
        self.add_metric(name, unit, value)


@dataclass
class Ports:
    """What one Lambda container holds: its clients (each its own), the settings, the metrics;
    ``budgets`` collects the ECS call budget of every service built (their waits are measured)."""

    clients: runtime.RecoveryClients
    settings: Settings
    metrics: RecordingMetrics
    budgets: list[EcsCallBudget]
    queues: dict[str, SimQueuePort] = field(default_factory=dict)


def default_service(ports: Ports) -> RecoveryService:
    """The service ``gpu_recovery.runtime`` builds, on the container's clients (no Auto Scaling
    client: the simulated cluster has no group)."""
    service = runtime.build_recovery_service(ports.settings, ports.clients, ports.metrics)
    ecs = service.ecs
    budget = ecs.budget if isinstance(ecs, EcsAdapter) else None
    if isinstance(budget, EcsCallBudget):
        ports.budgets.append(budget)
    return service


@dataclass
class Container:
    """A Lambda execution environment: ports, and the service built on them (lazily)."""

    ports: Ports
    factory: Callable[[Ports], Any]
    sim: Simulation | None = None  # the invocation's remaining time (Lambda's context)
    _service: Any = None

    @property
    def service(self) -> Any:
        if self._service is None:
            self._service = self.factory(self.ports)
        return self._service


def invocation_context(container: Container) -> LambdaContext | None:
    """The running invocation's Lambda context (the moto world's class, set by
    ``LambdaService``): its request id, its time left counted in simulated time to the
    invocation's deadline; None outside an invocation with one."""
    sim = container.sim
    process = sim.current if sim is not None else None
    if process is None or process.deadline is None:
        return None
    context: LambdaContext | None = process.context
    return context


def on_container(handle: Handle) -> Callable[[Container, dict[str, Any]], dict[str, Any]]:
    """A simulated function running a handler's body (``handlers.<name>.handle``, the one its
    ``lambda_handler`` runs) with the container's service and the time left and request id
    its context gives."""

    def handler(container: Container, event: dict[str, Any]) -> dict[str, Any]:
        context = invocation_context(container)
        if context is None:
            return handle(event, container.service)
        return run_body(handle, event, container.service, time_left=context.time_left,
                        request_id=context.aws_request_id)

    return handler


class ScaleWorld:
    """A simulated account with the recovery stack deployed (see the module docstring); built
    by ``local_mode.world.build_world(backend="scale", **options)``.

    ``settings`` overrides fields of the recovery ``Settings`` (``check_all_nodes_on_fault``,
    ``max_recovery_attempts``...); ``cluster`` passes timing to :class:`EcsCluster`.
    Use as a context manager (or call :meth:`close`): it installs the simulation's clock.
    """

    def __init__(self, *, seed: int = 0, settings: dict[str, Any] | None = None,
                 latencies: Latencies | None = None,
                 tx_conflict_window: float = DEFAULT_TX_CONFLICT_WINDOW,
                 copies: int = 2, delivery_delay: tuple[float, float] = (0.05, 0.5),
                 lambda_concurrency: int = 1000, function_timeouts: dict[str, float] | None = None,
                 sweep_every_seconds: float | None = SWEEP_EVERY_SECONDS,
                 service_factory: Callable[[Ports], Any] = default_service,
                 validate_dynamodb: bool = True, cluster: dict[str, Any] | None = None,
                 keep_invocations: bool = False, gang_fanout: bool = True,
                 gang_worker_concurrency: int = D.GANG_QUEUE.max_concurrency,
                 partition_throughput: bool = False) -> None:
        self.sim = Simulation(seed=seed)
        self.sim.install_clock()
        # The recovery code's own jitter (contention back-off, health-check retries) draws from
        # the random module: seeded too, so a run is reproducible for its seed.
        random.seed(seed)
        self.latencies = latencies or Latencies()
        self.account = Account(self.sim, self.latencies)
        self.dynamo = MemoryDynamo(
            {JOB_TABLE: "job", INSTANCE_TABLE: "instance"},
            context=self._context, now=lambda: self.sim.now,
            on_call=lambda operation: self.sim.pause(self.latencies.dynamodb_call(operation)),
            tx_conflict_window=tx_conflict_window, validate=validate_dynamodb,
            # DynamoDB's per-partition limits on the simulated clock (off: a bench turns it on).
            partition_throughput=PartitionThroughput() if partition_throughput else None)
        # keep_invocations: every Invocation (payload included) for inspection; off, only stats.
        self.lambdas = LambdaService(self.sim, concurrency=lambda_concurrency,
                                     keep_invocations=keep_invocations)
        # The one event bus, timed on the engine: each copy reaches Lambda after its own delay.
        self.bus = EventBus(clock=lambda: self.sim.now, copies=copies, keep_events=False,
                            timing=EngineTiming(self.sim, self.lambdas, delivery_delay=delivery_delay))
        self.cluster = EcsCluster(self.sim, self.account, self.bus, **(cluster or {}))
        # Every call held to what AWS accepts, as in the moto world (sim/contract/requests.py).
        definitions = C.table_definitions()
        self.requests = RequestGuard(ClusterState(self.cluster._by_ref.get, key_schemas(
            {JOB_TABLE: definitions["job"], INSTANCE_TABLE: definitions["instance"]})))
        self.account.requests = self.requests
        self.dynamo.check_request = lambda model, wire: self.requests.check("dynamodb", model, wire)
        self.topic = SnsTopic()
        self.metrics = RecordingMetrics()
        self.queues: dict[str, SqsQueue] = {}
        self.budgets: list[EcsCallBudget] = []  # every container's (their waits are measured)
        self.service_factory = service_factory
        # The queues (infra/gang.py, infra/tag_lookups.py) exist before any container is built.
        self.gang_fanout = gang_fanout
        sources = [q for q in D.QUEUES if gang_fanout or q is not D.GANG_QUEUE]
        for source in sources:
            self.add_queue(source.name, visibility_timeout=source.visibility_timeout_seconds,
                           max_receive_count=source.max_receives)
        gang_queue = self.queues.get(GANG_QUEUE)
        self.settings = replace(Settings(
            job_table=JOB_TABLE, instance_table=INSTANCE_TABLE, cluster=self.cluster.name,
            health_check_task=self.cluster.health_check_task, topic_arn=self.topic.arn,
            health_check_log_group=HEALTH_CHECK_LOG_GROUP,
            gang_queue_url=gang_queue.url if gang_queue is not None else "",
            tag_lookup_queue_url=self.queues[TAG_LOOKUP_QUEUE].url), **_typed(settings or {}))
        timeouts = {name: float(f.timeout_seconds) for name, f in D.FUNCTIONS.items()}
        timeouts.update(function_timeouts or {})
        for function in D.FUNCTIONS.values():
            if function.retries is not None:  # invoked asynchronously (rules, schedules)
                self.lambdas.add_function(function.name, on_container(HANDLES[function.name]),
                                          timeout=timeouts[function.name], make_container=self.container,
                                          async_retries=function.retries.attempts,
                                          max_event_age=function.retries.max_event_age_seconds)
        for source in sources:
            self.lambdas.add_function(source.function, on_container(HANDLES[source.function]),
                                      timeout=timeouts[source.function], make_container=self.container,
                                      async_retries=0)
        self.gang_worker_concurrency = gang_worker_concurrency
        wire_deployment(self.bus, self, self.cluster.arn, registration=self.settings.registration,
                        sweep_every_seconds=sweep_every_seconds, queues=tuple(sources))
        # Every call a function makes, held to its role's grants (local_mode.sim.contract).
        self.grants = scale_guard(self)
        self.account.call_checks.append(self.grants.check)
        self.dynamo.before_call = partial(self.grants.check, "dynamodb")

    # --- where the deployed functions run (``wiring.FunctionHost``) ---------------------
    def target(self, function: D.Function) -> str:
        return function.name  # the engine's LambdaService function of that name

    def attach_queue(self, source: D.QueueSource) -> None:
        # The poller waits the batching window for a batch to fill (without one: its own delay).
        concurrency = self.gang_worker_concurrency if source is D.GANG_QUEUE else source.max_concurrency
        self.queues[source.name].attach(self.lambdas, source.function, batch_size=source.batch_size,
                                        max_concurrency=concurrency,
                                        poll_delay=source.batching_window_seconds or POLL_DELAY_SECONDS)

    def first_tick(self, every_seconds: float) -> float:
        return self.sim.now + self.sim.rng.uniform(0, every_seconds)

    def _context(self) -> tuple[str, str]:
        current = self.sim.current
        return (current.label, current.name) if current is not None else ("setup", "setup")

    # --- containers and ports ---------------------------------------------------------
    def ports(self) -> Ports:
        """Fresh ports (new clients: their own botocore retry quota), as a new container has."""
        # One SQS client for every queue the settings name, as boto3's in a Lambda.
        gang = self.queues.get(GANG_QUEUE) if self.gang_fanout else None
        lookups = self.queues.get(TAG_LOOKUP_QUEUE)
        addressed = {q.url: q for q in (gang, lookups) if q is not None}
        clients = runtime.RecoveryClients(
            dynamodb=self.dynamo, ecs=self.cluster.client(), ec2=Ec2Client(self.cluster),
            ssm=SsmClient(self.cluster, self.settings.reboot_document),
            sns=SnsClient(self.account, self.topic), logs=LogsClient(self.account, self.cluster.logs),
            sqs=next(iter(addressed.values())).client(addressed) if addressed else None)
        return Ports(clients=clients, settings=self.settings, metrics=self.metrics, budgets=self.budgets,
                     queues={name: queue.port() for name, queue in self.queues.items()})

    def container(self) -> Container:
        return Container(self.ports(), self.service_factory, self.sim)

    def add_queue(self, name: str, *, visibility_timeout: float = 120.0,
                  max_receive_count: int = 5) -> SqsQueue:
        """A queue with its dead-letter queue (``<name>-dlq``); containers created from now
        on get a ``QueuePort`` for it in ``ports.queues[name]``."""
        dead = SqsQueue(self.sim, self.account, f"{name}-dlq", visibility_timeout=visibility_timeout)
        queue = SqsQueue(self.sim, self.account, name, visibility_timeout=visibility_timeout,
                         max_receive_count=max_receive_count, dead_letter=dead)
        self.queues[name] = queue
        return queue

    def add_worker(self, queue: SqsQueue, function: str,
                   handle: Callable[[Container, dict[str, Any], int], Any], *, timeout: float = 60.0,
                   batch_size: int = 10, max_concurrency: int | None = None) -> None:
        """A worker function on ``queue`` (ReportBatchItemFailures): ``handle(container,
        body, receive_count)`` per message; one that raises comes back after the visibility
        timeout (and goes to the dead-letter queue after ``max_receive_count`` receives)."""

        def handler(container: Container, event: dict[str, Any]) -> dict[str, Any]:
            return sqs_batch_handler(partial(handle, container))(container, event)

        self.lambdas.add_function(function, handler, timeout=timeout, make_container=self.container,
                                  async_retries=0)
        queue.attach(self.lambdas, function, batch_size=batch_size, max_concurrency=max_concurrency)

    # --- inspection ---------------------------------------------------------------------
    def job(self, job_id: str) -> dict[str, Any] | None:
        """The job item (not metered)."""
        return self.dynamo.peek(JOB_TABLE, {C.JOB_PK: C.job_item_key(job_id)})

    def rank(self, job_id: str, rank: int) -> dict[str, Any] | None:
        return self.dynamo.peek(JOB_TABLE, {C.JOB_PK: C.rank_item_key(job_id, rank)})

    def suspects(self, job_id: str, attempt: int = 1) -> dict[str, str]:
        """node -> verdict of the attempt's fault (its suspect items; not metered)."""
        prefix = f"{JOB_TABLE}:{C.suspect_key_prefix(job_id, attempt)}"
        found: dict[str, str] = {}
        for label in self.dynamo.item_bytes(JOB_TABLE):
            if label.startswith(prefix):
                item = self.dynamo.peek_attributes(JOB_TABLE, {C.JOB_PK: label.split(":", 1)[1]},
                                                   ("node", "verdict")) or {}
                found[str(item.get("node"))] = str(item.get("verdict"))
        return found

    def gang_queue(self) -> SqsQueue | None:
        return self.queues.get(GANG_QUEUE) if self.gang_fanout else None

    def reset_measurements(self) -> None:
        self.dynamo.meter.reset()
        self.account.stats.reset()
        self.lambdas.reset_stats()
        self.metrics.values.clear()
        self.cluster.counters.clear()
        self.cluster.health_checks.clear()
        self.cluster.reboots.clear()
        self.topic.published.clear()
        self.topic.refused.clear()
        for budget in self.budgets:
            budget.waited_seconds = 0.0
        for queue in self.queues.values():
            queue.reset_stats()

    # --- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        self.sim.close()
        gr_clock.reset_clock()

    def __enter__(self) -> ScaleWorld:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
        if not (exc and isinstance(exc[1], ContractViolation)):
            self.requests.raise_if_violated()


# ================================================================== a tagged job
@dataclass
class TaggedJob:
    """A job started by an external launcher with the recovery tags (job id, rank, world size)."""

    job_id: str
    world_size: int
    tasks: list[Task]
    nodes: list[Node]
    running: Counter[int] = field(default_factory=Counter)  # attempt -> ranks RUNNING now
    all_running_at: dict[int, float] = field(default_factory=dict)  # attempt -> first time all ran


def launch_tagged_job(world: ScaleWorld, job_id: str, nodes: list[Node], *,
                      tasks_per_node: int = 1, gpus_per_task: int = 8, family: str = "train",
                      registration: str = "tags") -> TaggedJob:
    """Start the job's ranks in the data plane (rank r on ``nodes[r // tasks_per_node]``) and
    track, per attempt, how many of its ranks run. ``registration``: the recovery tags
    ("tags"), the registration convention's group and environment ("convention"), or both."""
    task_definition = world.cluster.register_task_definition(family, gpus=gpus_per_task)
    world_size = len(nodes) * tasks_per_node
    job = TaggedJob(job_id, world_size, [], list(nodes))
    group = C.job_group(job_id)

    def observe(task: Task) -> None:
        values = task.tags
        env = container_environment(task.overrides)
        if values.get(C.TAG_JOB_ID) != job_id and task.group != group:
            return
        attempt = int(values.get(C.TAG_ATTEMPT) or env.get(C.ENV_VAR_ATTEMPT) or 1)
        was = getattr(task, "_counted", False)
        now = task.last_status == "RUNNING"
        if now and not was:
            job.running[attempt] += 1
            if job.running[attempt] == world_size and attempt not in job.all_running_at:
                job.all_running_at[attempt] = world.sim.now
        elif was and not now:
            job.running[attempt] -= 1
        task._counted = now  # type: ignore[attr-defined]

    world.cluster.observers.append(observe)
    by_tags = registration in ("tags", "both")
    by_convention = registration in ("convention", "both")
    for rank in range(world_size):
        tags = [{"key": C.TAG_JOB_ID, "value": job_id}, {"key": C.TAG_RANK, "value": str(rank)},
                {"key": C.TAG_WORLD_SIZE, "value": str(world_size)}] if by_tags else []
        overrides = {"containerOverrides": [{"name": "trainer", "environment": [
            {"name": C.ENV_VAR_RANK, "value": str(rank)},
            {"name": C.ENV_VAR_WORLD_SIZE, "value": str(world_size)},
            {"name": C.ENV_VAR_ATTEMPT, "value": "1"}]}]} if by_convention else None
        job.tasks.append(world.cluster.launch(task_definition, nodes[rank // tasks_per_node], tags=tags,
                                              started_by="launcher", group=group if by_convention else None,
                                              overrides=overrides))
    return job


def _typed(overrides: dict[str, Any]) -> dict[str, Any]:
    """``Settings`` overrides as JSON gives them, the nested policies built (``validation``:
    the fields of ``domain.validation.ValidationPolicy``, e.g. ``{"enabled": true}``)."""
    typed = dict(overrides)
    if isinstance(typed.get("validation"), dict):
        typed["validation"] = ValidationPolicy(**typed["validation"])
    return typed
