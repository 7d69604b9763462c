"""Wiring: builds services from the environment, once per Lambda container.

Handlers call these factories lazily (on first invocation, not at import), so local
mode can install its emulator and hooks before any boto3 client exists. ``reset``
forgets everything (tests and local mode switch environments with it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Each factory imports what its service needs when it first builds it: a function loads only
# its own services' modules (an authorizer no recovery service, a recovery handler none of
# the queue's; tests/handlers/test_cold_imports.py holds each handler to its list).
from gpu_recovery.adapters import aws

if TYPE_CHECKING:
    from gpu_recovery.adapters.ecs import EcsAdapter
    from gpu_recovery.domain.fault_catalog import FaultCatalog
    from gpu_recovery.domain.rate_limit import TokenBucket
    from gpu_recovery.heartbeat.ports import MetricsPort as HeartbeatMetricsPort
    from gpu_recovery.heartbeat.service import HeartbeatService
    from gpu_recovery.heartbeat.tokens import TokenStore
    from gpu_recovery.queue.control import JobControlService
    from gpu_recovery.queue.jobs_api.service import JobQueueService
    from gpu_recovery.queue.jobs_api.triggers import SchedulerTrigger
    from gpu_recovery.queue.scheduler import QueueScheduler
    from gpu_recovery.recovery import MetricsPort, RecoveryService
    from gpu_recovery.repository import Repository
    from gpu_recovery.repository.control_secrets import ControlSecrets
    from gpu_recovery.settings import JobsApiSettings, Settings

_lock = threading.Lock()
_services: dict[str, Any] = {}


class PowertoolsMetrics:
    """Adapts Powertools Metrics to the service's MetricsPort."""

    def __init__(self, metrics: Any) -> None:
        self._metrics = metrics

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self._metrics.add_metric(name=name, unit=unit, value=value)

    def add_dimensioned_metric(self, name: str, unit: str, value: float, dimensions: dict[str, str]) -> None:
        """A metric with dimensions of its own (flushed at once, beside the function's metrics)."""
        self._single_metric(name, unit, value, dimensions)

    def add_metric_now(self, name: str, unit: str, value: float) -> None:
        """A metric flushed at once (its own EMF line now, same namespace and ``service``
        dimension as the function's): not lost if the invocation times out before its end."""
        self._single_metric(name, unit, value, {})

    def _single_metric(self, name: str, unit: str, value: float, dimensions: dict[str, str]) -> None:
        from aws_lambda_powertools.metrics import MetricUnit, single_metric  # the functions' layer

        service = str(getattr(self._metrics, "service", "") or "")
        namespace = getattr(self._metrics, "namespace", None) or None
        with single_metric(name=name, unit=MetricUnit(unit), value=value, namespace=namespace,
                           default_dimensions={"service": service} if service else None) as metric:
            for key, label in dimensions.items():
                metric.add_dimension(name=key, value=label)


def repository(settings: Settings | None = None) -> Repository:
    from gpu_recovery.repository import Repository
    from gpu_recovery.settings import Settings

    settings = settings or Settings.from_env()
    return Repository(aws.resource("dynamodb"), settings.job_table, settings.instance_table,
                      deadline_shards=settings.deadline_index_shards)


def ecs_adapter(repo: Repository, cluster: str, bucket: TokenBucket, client: Any = None, *,
                describe_budget: bool = False) -> EcsAdapter:
    """ECS with the stack's shared control-plane budget (one item in the instance table);
    ``client``: the ECS client (default: the container's boto3 one); ``describe_budget``: and
    its Describe budget (another item: the recovery functions')."""
    from gpu_recovery.adapters.ecs import EcsAdapter
    from gpu_recovery.adapters.ecs_budget import EcsCallBudget
    from gpu_recovery.repository.rate_limit import RateLimitRepository
    from gpu_recovery.settings import DESCRIBE_BUCKET

    describe = (EcsCallBudget(RateLimitRepository.describe_budget(repo.tables), DESCRIBE_BUCKET)
                if describe_budget else None)
    budget = EcsCallBudget(RateLimitRepository(repo.tables), bucket)
    return EcsAdapter(client or aws.client("ecs"), cluster, budget=budget, describe_budget=describe)


def fault_catalog(settings: Settings) -> FaultCatalog:
    """The shipped catalog with the deployment's override (validated at synth; validated
    again here so a hand-edited file fails the cold start loudly, not a fault later)."""
    from gpu_recovery.domain.fault_catalog import load_catalog

    key = f"catalog:{settings.fault_catalog_override}"
    catalog = _services.get(key)
    if catalog is None:
        catalog = load_catalog(None, override=settings.fault_catalog_override or None)
        _services[key] = catalog
    return catalog


@dataclass(frozen=True)
class RecoveryClients:
    """The AWS clients a recovery service calls: boto3's in a Lambda, the scale simulator's
    stand-ins (same API) in ``local_mode.scale_recovery``. No ``autoscaling``: no
    replacement through an Auto Scaling group; no ``sqs``: no gang fan-out queue."""

    dynamodb: Any  # the boto3 DynamoDB resource
    ecs: Any
    ec2: Any
    ssm: Any
    sns: Any
    logs: Any
    autoscaling: Any = None
    sqs: Any = None


def build_recovery_service(settings: Settings, clients: RecoveryClients,
                           metrics: MetricsPort | None = None) -> RecoveryService:
    """The recovery service on these clients: the one place its ports are put together."""
    from gpu_recovery.adapters.autoscaling import AutoScalingReplacer
    from gpu_recovery.adapters.capacity import CapacityReservations
    from gpu_recovery.adapters.compute import RebootAdapter
    from gpu_recovery.adapters.logs import VerdictLogReader
    from gpu_recovery.adapters.notifier import SnsNotifier
    from gpu_recovery.adapters.queue import GangQueue, Redeliveries
    from gpu_recovery.constants import CLAIM_LEASE_SECONDS
    from gpu_recovery.recovery import RecoveryService
    from gpu_recovery.repository import Repository

    repo = Repository(clients.dynamodb, settings.job_table, settings.instance_table,
                      deadline_shards=settings.deadline_index_shards)
    return RecoveryService(
        repo=repo,
        ecs=ecs_adapter(repo, settings.cluster, settings.ecs_api, client=clients.ecs, describe_budget=True),
        rebooter=RebootAdapter(clients.ec2, clients.ssm, settings.reboot_document),
        notifier=SnsNotifier(clients.sns, settings.topic_arn),
        verdicts=VerdictLogReader(clients.logs, settings.health_check_log_group),
        settings=settings,
        metrics=metrics,
        catalog=fault_catalog(settings),
        replacer=AutoScalingReplacer(clients.autoscaling) if clients.autoscaling is not None else None,
        gang_queue=(GangQueue(clients.sqs, settings.gang_queue_url)
                    if settings.gang_queue_url and clients.sqs is not None else None),
        tag_lookups=(GangQueue(clients.sqs, settings.tag_lookup_queue_url)
                     if settings.tag_lookup_queue_url and clients.sqs is not None else None),
        capacity=CapacityReservations(clients.ec2),
        redeliveries=(Redeliveries(clients.sqs, CLAIM_LEASE_SECONDS) if clients.sqs is not None else None),
    )


def recovery_service(metrics: MetricsPort | None = None) -> RecoveryService:
    from gpu_recovery.settings import Settings

    with _lock:
        service = _services.get("recovery")
        if service is None:
            settings = Settings.from_env()
            service = build_recovery_service(settings, RecoveryClients(
                dynamodb=aws.resource("dynamodb"), ecs=aws.client("ecs"), ec2=aws.client("ec2"),
                ssm=aws.client("ssm"), sns=aws.client("sns"), logs=aws.client("logs"),
                autoscaling=aws.client("autoscaling"),
                sqs=aws.client("sqs") if settings.gang_queue_url or settings.tag_lookup_queue_url else None))
            _services["recovery"] = service
    if metrics is not None:
        service.metrics = metrics
    return service


def queue_scheduler(metrics: MetricsPort | None = None) -> QueueScheduler:
    """The scheduler tick, over the recovery service's ports (per invocation: its lease
    owner is new each time, and its settings are read again); the task-definition and
    host-address caches live per container."""
    from gpu_recovery.adapters.hosts import HostAddresses
    from gpu_recovery.adapters.task_definitions import TaskDefinitions
    from gpu_recovery.queue.scheduler import build_scheduler
    from gpu_recovery.repository.time_sharing import QuotaRepository
    from gpu_recovery.settings import SchedulerConfig

    recovery = recovery_service(metrics)
    config = SchedulerConfig.from_env()
    session = aws.session()
    with _lock:
        caches = _services.get("scheduler_caches")
        if caches is None or caches[0] is not session:
            caches = (session, TaskDefinitions(aws.client("ecs")),
                      HostAddresses(aws.client("ec2"), aws.client("ssm")))
            _services["scheduler_caches"] = caches
    return build_scheduler(
        repo=recovery.repo, ecs_adapter=recovery.ecs, recovery=recovery, task_definitions=caches[1],
        hosts=caches[2], config=config, quotas=QuotaRepository(aws.resource("dynamodb"),
                                                               config.sharing.quota_table),
    )


def heartbeat_service(metrics: HeartbeatMetricsPort | None = None) -> HeartbeatService:
    """The node heartbeat service, once per boto3 session (local mode and tests swap
    sessions with ``aws.reset()``; a new session builds a new service)."""
    from gpu_recovery.adapters.notifier import SnsNotifier
    from gpu_recovery.heartbeat.service import HeartbeatService
    from gpu_recovery.recovery.notices import Notices
    from gpu_recovery.repository.heartbeat import HeartbeatRepository
    from gpu_recovery.settings import Settings, heartbeat_index_shards, heartbeat_settings

    session = aws.session()
    with _lock:
        built = _services.get("heartbeat")
        if built is None or built[0] is not session:
            settings = Settings.from_env()
            repo = repository(settings)
            service = HeartbeatService(
                repo=HeartbeatRepository(repo, shards=heartbeat_index_shards()),
                settings=heartbeat_settings(),
                ecs=ecs_adapter(repo, settings.cluster, settings.ecs_api),
                notices=Notices(repo.notices, repo.faults,
                                SnsNotifier(aws.client("sns"), settings.topic_arn)),
                recovery=lambda: recovery_service(),
                catalog=fault_catalog(settings),
            )
            built = (session, service)
            _services["heartbeat"] = built
    if metrics is not None:
        built[1].metrics = metrics
    return built[1]  # type: ignore[no-any-return]


def jobs_api_settings() -> JobsApiSettings:
    """The jobs API's settings, validated once per container (``reset`` forgets them)."""
    from gpu_recovery.settings import JobsApiSettings

    with _lock:
        settings = _services.get("jobs_settings")
        if settings is None:
            settings = JobsApiSettings.from_env()
            _services["jobs_settings"] = settings
    return settings  # type: ignore[no-any-return]


def jobs_service(trigger: SchedulerTrigger | None) -> JobQueueService:
    """The jobs API's service; ``trigger`` wakes the scheduler after a submit or cancel
    (None: invoke the scheduler function the stack names, if any)."""
    from gpu_recovery.adapters.logs import TrainingLogReader
    from gpu_recovery.adapters.queue import GangQueue
    from gpu_recovery.adapters.scheduler_trigger import LambdaInvoker
    from gpu_recovery.adapters.task_definitions import TaskDefinitions
    from gpu_recovery.queue.jobs_api.service import JobQueueService
    from gpu_recovery.queue.jobs_api.triggers import LambdaSchedulerTrigger, NoSchedulerTrigger
    from gpu_recovery.queue.quotas import QuotaService
    from gpu_recovery.repository import Repository
    from gpu_recovery.repository.jobs_api import JobQueueRepository
    from gpu_recovery.repository.time_sharing import QuotaRepository
    from gpu_recovery.settings import ecs_api_bucket

    settings = jobs_api_settings()
    if trigger is None:
        trigger = (LambdaSchedulerTrigger(LambdaInvoker(aws.client("lambda"), settings.scheduler_function))
                   if settings.scheduler_function else NoSchedulerTrigger())
    ecs_client = aws.client("ecs")
    base = Repository(aws.resource("dynamodb"), settings.job_table, settings.instance_table)
    return JobQueueService(
        repo=JobQueueRepository(base),
        ecs=ecs_adapter(base, settings.cluster, ecs_api_bucket()),
        # Not cached: a submit pins the revision ECS resolves now.
        task_definitions=TaskDefinitions(ecs_client, ttl_seconds=0),
        log_reader=TrainingLogReader(aws.client("logs")),
        cluster=settings.cluster,
        scheduler=trigger,
        access=settings.access,
        default_budgets=settings.default_budgets,
        quotas=QuotaService(QuotaRepository(aws.resource("dynamodb"), settings.sharing.quota_table),
                            settings.sharing.default_node_quotas),
        suspend_grace_seconds=settings.sharing.suspend_grace_seconds,
        gang_queue=(GangQueue(aws.client("sqs"), settings.gang_queue_url) if settings.gang_queue_url
                    else None),
        gang_inline_max_ranks=settings.gang_inline_max_ranks,
    )


def job_control_service(metrics: MetricsPort | None = None) -> JobControlService:
    """The job-control channel of training code (the control API; its authorizer reads
    ``control_secrets`` alone); ``metrics`` receives what its go_suspend() records
    (suspends requested, forced)."""
    from gpu_recovery.queue.control import JobControlService
    from gpu_recovery.repository import Repository
    from gpu_recovery.repository.control_secrets import ControlSecrets
    from gpu_recovery.settings import JobControlSettings

    session = aws.session()
    with _lock:
        built = _services.get("job_control")
    if built is None or built[0] is not session:
        settings = JobControlSettings.from_env()
        repo = Repository(aws.resource("dynamodb"), settings.job_table, settings.instance_table)

        def go_suspend(job_id: str, rank: int, attempt: int | None) -> Any:
            return recovery_service(_services.get("job_control_metrics")).go_suspend(job_id, rank, attempt)

        def preflights() -> Any:
            return recovery_service(_services.get("job_control_metrics")).preflights

        service = JobControlService(repo.jobs, go_suspend, settings.control_poll_seconds,
                                    secrets=ControlSecrets(repo.tables.db, repo.tables.job_table_name).of,
                                    preflights=preflights)
        built = (session, service)
        with _lock:
            _services["job_control"] = built
    if metrics is not None:
        _services["job_control_metrics"] = metrics
    return built[1]  # type: ignore[no-any-return]


def node_token_store() -> TokenStore:
    """The node-token store of the authorizer and the admin CLI, once per session."""
    from gpu_recovery.heartbeat.tokens import TokenStore
    from gpu_recovery.repository.node_tokens import NodeTokenRepository
    from gpu_recovery.settings_base import node_token_table

    session = aws.session()
    table = node_token_table()
    with _lock:
        built = _services.get("tokens")
        if built is None or built[0] is not session or built[1] != table:
            built = (session, table, TokenStore(NodeTokenRepository(aws.resource("dynamodb").Table(table))))
            _services["tokens"] = built
    return built[2]  # type: ignore[no-any-return]


def control_secrets() -> ControlSecrets:
    """The jobs' control secrets, for the job-control authorizer, once per session (the
    job table alone: the authorizer builds no control or recovery service)."""
    from gpu_recovery.repository.base import DynamoGateway
    from gpu_recovery.repository.control_secrets import ControlSecrets
    from gpu_recovery.settings_base import job_table

    session = aws.session()
    table = job_table()
    with _lock:
        built = _services.get("control_secrets")
        if built is None or built[0] is not session or built[1] != table:
            built = (session, table, ControlSecrets(DynamoGateway(aws.resource("dynamodb")), table))
            _services["control_secrets"] = built
    return built[2]  # type: ignore[no-any-return]


def reset(*, clients: bool = True) -> None:
    """Forget built services; with ``clients`` also the boto3 session and clients.

    Local mode passes ``clients=False``: its emulator registered hooks on the session.
    """
    with _lock:
        _services.clear()
    if clients:
        aws.reset()
