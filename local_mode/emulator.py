"""``LocalAws``: the embedded AWS emulator (moto) that local mode and tests run against.

Entering the context:

* starts ``moto.mock_aws()`` and sets fake credentials and region (us-east-1,
  account 123456789012), with AWS config files pointed at /dev/null;
* creates what the stack deploys: the DynamoDB tables (``table_definitions()``,
  PAY_PER_REQUEST: jobs, container instances, node tokens; and the jobs API's
  idempotency table, PK ``id``, TTL ``expiration``), the SNS topic
  ``gpu-training-notifications`` with an SQS queue subscribed (envelope delivery,
  so subject and message attributes survive), the ECS cluster and the DCGM
  health-check task definition (GPU resource requirement);
* sets every environment variable the Lambda handlers read (heartbeat settings
  included: stale 180 s, NODE_LOST fail 1800 s, hang detection off unless
  ``hang_seconds``, hang action ``notify``);
* resets ``gpu_recovery.adapters.aws`` and registers **dispatching** botocore hooks
  on its session before any handler client exists, so :class:`~local_mode.api_hooks.ApiHooks` listeners
  (the simulated ECS data plane) and :class:`~local_mode.sim.api_errors.ApiFaults` (error
  injection) can be added at any time afterwards;
* holds every request of the handlers' session to what AWS accepts (``requests``: the
  request guard of ``local_mode.sim.contract.requests``; exiting raises its violations);
* makes botocore's retry back-off a no-op (delays are recorded in ``retry_sleeps``)
  so injected throttling costs no wall time;
* answers what AWS documents and moto never gives (``answers``,
  :class:`~local_mode.sim.answers.DocumentedAnswers`): GetLogEvents in partial and empty
  pages, lines readable seconds after they were written (``log_paging``), and the documented
  failure shapes a call can be broken in;
* serializes DynamoDB attribute values in moto's responses directly (the same bytes as
  moto's generic serializer, a fraction of its CPU: see
  ``local_mode.moto_patches``);
* keeps what moto recomputes on every call it serves although it is fixed once the
  backends load (a URL's handler, the attribute names its serializer reads): see
  ``local_mode.sim.moto_dispatch``.

DynamoDB has two backends (``LocalAws(dynamodb=...)``):

* ``"moto"`` (the default): moto's DynamoDB, exact API behaviour for the tests that pin it;
* ``"memory"``: the in-memory store of ``local_mode.sim.dynamo`` behind real boto3
  clients (``local_mode.sim.dynamo.botocore_backend``), several times cheaper per call: the crash
  campaigns and the soak. The handlers' DynamoDB resource and client and the internal ones
  (``resource("dynamodb")``, ``client("dynamodb")``) read the same store, whose tables are
  created as above; every call goes through the same botocore events as a moto call, so the
  hooks, ``call_faults`` and ``faults`` see and break it alike (same service "dynamodb",
  operation and call site, same order; injected errors retried by botocore's standard
  retries). Not modelled there: TTL expiry (moto does not expire items either), streams,
  PartiQL, operations the stack does not use.

Exiting restores the environment, the clock and the adapters. Example::

    with LocalAws(max_recovery_attempts=2) as local:
        ...
        for n in local.notifications():
            print(n["subject"], n["attributes"].get("event_kind"))

``local.client("ecs")`` is an *internal* client (no hooks, no faults) for setup and
inspection; handlers use ``gpu_recovery.adapters.aws.client`` which sees the hooks.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any

import boto3
import botocore.endpoint
from moto import mock_aws
from moto.moto_api import state_manager
from moto.moto_api._internal import mock_random

from gpu_recovery import clock as gr_clock
from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from gpu_recovery.metric_names import METRICS_NAMESPACE

from .api_hooks import ApiHooks, hook_answer
from .events import ACCOUNT_ID, REGION
from .health_verdicts import HEALTH_CHECK_LOG_GROUP
from .moto_patches import (
    NoSleepTime,
    compare_missing_attributes_as_dynamodb_does,
    install_emulator_speedups,
    judge_log_events_on_the_installed_clock,
    make_dynamodb_writes_atomic,
    pass_start_task_network_configuration,
    share_model_loader,
)
from .sim.answers import DocumentedAnswers
from .sim.api_errors import ApiFaults
from .sim.broken_calls import CallFaults
from .sim.contract.grants import GrantsGuard
from .sim.contract.requests import ContractViolation, RequestGuard
from .sim.contract.state import MotoState, key_schemas
from .sim.contract.worlds import moto_guard
from .sim.dynamo import MemoryDynamo
from .sim.dynamo.botocore_backend import serve_dynamodb_from
from .sim.log_pages import LogPaging
from .sim.moto_dispatch import install_moto_dispatch

TOPIC_NAME = "gpu-training-notifications"
QUEUE_NAME = "gpu-training-notifications-inbox"
GANG_QUEUE_NAME = "gpu-recovery-gang-batches"  # the gang fan-out's queue (see EventBus.add_queue)
TAG_LOOKUP_QUEUE_NAME = "gpu-recovery-tag-lookups"  # named to the handlers with its worker wired
#: ``LocalAws(dynamodb=...)``: moto (exact API behaviour, the default) or the in-memory store
DYNAMODB_BACKENDS = ("moto", "memory")


class LocalAws:
    """Context manager: moto + the stack's resources + handler environment."""

    _active: list[LocalAws] = []
    #: this process ends after its one run (a crash campaign's forked run): leaving moto's
    #: accounts as they are is then enough, its reset of every backend (EC2's default VPC,
    #: AMIs...) would be thrown away with the process
    disposable_process: bool = False

    @classmethod
    def active(cls) -> LocalAws | None:
        """The innermost LocalAws entered (local-mode wiring finds its hooks here)."""
        return cls._active[-1] if cls._active else None

    def __init__(
        self,
        *,
        cluster_name: str = "gpu-cluster",
        max_recovery_attempts: int = 1,
        suspect_exit_codes: tuple[int, ...] | list[int] = (1,),
        reboot_timeout_minutes: int = 15,
        health_check_timeout_minutes: int = 30,
        dcgm_level: int = 2,
        health_check_gpus: int = 8,
        service_name: str = "gpu-recovery",
        heartbeat_stale_seconds: int = 180,
        node_lost_fail_seconds: int = 1800,
        hang_seconds: int = 0,
        hang_action: str = "notify",
        metrics_disabled: bool = False,
        sleep_on_retry: bool = False,
        extra_env: dict[str, str] | None = None,
        dynamodb: str = "moto",
        log_paging: LogPaging | None = None,
    ) -> None:
        if dynamodb not in DYNAMODB_BACKENDS:
            raise ValueError(f"dynamodb is one of {DYNAMODB_BACKENDS}, not {dynamodb!r}")
        #: where the tables live: "moto" or "memory" (see the module docstring)
        self.dynamodb_backend = dynamodb
        #: the in-memory store (``dynamodb="memory"``), None with moto
        self.memory_dynamodb: MemoryDynamo | None = None
        self.cluster_name = cluster_name
        self.cluster_arn = f"arn:aws:ecs:{REGION}:{ACCOUNT_ID}:cluster/{cluster_name}"
        self.account_id = ACCOUNT_ID
        self.region = REGION
        self.job_table = C.DEFAULT_JOB_TABLE_NAME
        self.instance_table = C.DEFAULT_INSTANCE_TABLE_NAME
        self.node_token_table = C.DEFAULT_NODE_TOKEN_TABLE_NAME
        self.idempotency_table = C.DEFAULT_IDEMPOTENCY_TABLE_NAME
        self.quota_table = C.DEFAULT_QUOTA_TABLE_NAME
        self.health_check_gpus = health_check_gpus
        self.topic_arn = ""
        self.queue_url = ""
        self.health_check_task_definition_arn = ""
        self.gpu_reset_task_definition_arn = ""
        self.hooks = ApiHooks()
        self.faults = ApiFaults()
        #: one fault at the n-th API call (crash-consistency tests)
        self.call_faults = CallFaults()
        #: every handler request held to what AWS accepts (sim/contract/requests.py)
        self.requests = RequestGuard()
        #: the answers AWS documents that moto never gives (GetLogEvents pages, failure shapes)
        self.answers = DocumentedAnswers(paging=log_paging or LogPaging())
        #: the grants guard: every call a handler makes must be allowed by its function's role
        #: (``local_mode.sim.contract.grants``; its ``denials`` fail the run)
        self.grants: GrantsGuard | None = None
        #: back-off delays botocore asked for (not slept unless sleep_on_retry)
        self.retry_sleeps: list[float] = []
        self._sleep_on_retry = sleep_on_retry
        self._settings = {
            C.ENV_JOB_TABLE: self.job_table,
            C.ENV_INSTANCE_TABLE: self.instance_table,
            C.ENV_CLUSTER_NAME: cluster_name,
            C.ENV_MAX_RECOVERY_ATTEMPTS: str(max_recovery_attempts),
            C.ENV_SUSPECT_EXIT_CODES: json.dumps(list(suspect_exit_codes)),
            C.ENV_REBOOT_TIMEOUT_MINUTES: str(reboot_timeout_minutes),
            C.ENV_HEALTH_CHECK_TIMEOUT_MINUTES: str(health_check_timeout_minutes),
            C.ENV_DCGM_LEVEL: str(dcgm_level),
            C.ENV_HEALTH_CHECK_GPUS: str(health_check_gpus),
            C.ENV_HEALTH_CHECK_LOG_GROUP: HEALTH_CHECK_LOG_GROUP,
            C.ENV_NODE_TOKEN_TABLE: self.node_token_table,
            C.ENV_IDEMPOTENCY_TABLE: self.idempotency_table,
            C.ENV_QUOTA_TABLE: self.quota_table,
            C.ENV_HEARTBEAT_STALE_SECONDS: str(heartbeat_stale_seconds),
            C.ENV_NODE_LOST_FAIL_SECONDS: str(node_lost_fail_seconds),
            C.ENV_HANG_SECONDS: str(hang_seconds),
            C.ENV_HANG_ACTION: hang_action,
            C.ENV_POWERTOOLS_SERVICE_NAME: service_name,
            C.ENV_POWERTOOLS_METRICS_NAMESPACE: METRICS_NAMESPACE,
            "POWERTOOLS_TRACE_DISABLED": "true",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        if metrics_disabled:
            self._settings["POWERTOOLS_METRICS_DISABLED"] = "true"
        self._settings.update(extra_env or {})
        self.node_token_table = self._settings[C.ENV_NODE_TOKEN_TABLE]
        self.idempotency_table = self._settings[C.ENV_IDEMPOTENCY_TABLE]
        self.quota_table = self._settings[C.ENV_QUOTA_TABLE]
        tables = {name: C.table_definitions()[kind] for kind, name in (
            ("job", self.job_table), ("instance", self.instance_table),
            ("node_token", self.node_token_table), ("quota", self.quota_table))}
        tables[self.idempotency_table] = {"KeySchema": [{"AttributeName": "id", "KeyType": "HASH"}]}
        self.requests.state = MotoState(ACCOUNT_ID, REGION, key_schemas(tables))
        #: tables created on the stack's behalf (see ``_tolerate_create_table``)
        self._provisioned_tables: set[str] = set()
        self.env: dict[str, str] = {}
        self._saved_env: dict[str, str | None] = {}
        self._mock: Any = None
        self._session: boto3.session.Session | None = None
        self._clients: dict[str, Any] = {}
        self._client_lock = threading.Lock()
        self._notif_lock = threading.Lock()
        self._notifications: list[dict[str, Any]] = []
        self._saved_endpoint_time: Any = None

    # --- lifecycle ---------------------------------------------------------------
    def __enter__(self) -> LocalAws:
        self._set_env(self._settings)
        self._mock = mock_aws()
        self._mock.start()
        # moto's ids (task and container-instance ARNs, request ids) from a seeded generator:
        # a world runs the same calls in the same order in every process (the crash campaigns
        # collect each flow's calls in every pytest worker and break them by position).
        mock_random.seed(0)
        make_dynamodb_writes_atomic()
        compare_missing_attributes_as_dynamodb_does()
        pass_start_task_network_configuration()
        judge_log_events_on_the_installed_clock()
        install_emulator_speedups()
        install_moto_dispatch()
        # moto advances a described task RUNNING -> ... -> STOPPED on its own; the
        # simulated data plane owns task state instead.
        state_manager.set_transition("ecs::task", {"progression": "manual", "times": 10**12})
        self._saved_endpoint_time = botocore.endpoint.time
        if not self._sleep_on_retry:
            botocore.endpoint.time = NoSleepTime(self.retry_sleeps.append)  # type: ignore[assignment]
        self._session = boto3.session.Session()
        share_model_loader(self._session)
        self.answers.watch_writes(self._session.events)  # the simulation writes its logs here
        if self.dynamodb_backend == "memory":
            # No transaction-conflict model: moto has none, and the two backends answer alike.
            self.memory_dynamodb = MemoryDynamo(tx_conflict_window=0,
                                                arn_prefix=f"arn:aws:dynamodb:{REGION}:{ACCOUNT_ID}")
            serve_dynamodb_from(self._session, self.memory_dynamodb)
        try:
            self._create_resources()
        except Exception:
            self.__exit__(None, None, None)
            raise
        aws.reset()
        share_model_loader(aws.session())
        events = aws.session().events
        self.requests.install(aws.session())
        events.register("before-parameter-build", self.hooks.stash_params)
        events.register("before-call", self.hooks.before_call)
        events.register("after-call", self.hooks.after_call)
        events.register_first("before-send", self.faults.before_send)
        events.register_first("before-call", self.call_faults.before_call)
        # After the broken call's before-call hook (which may ask for a shape), before its
        # after-call one (a lost response is lost after the answer took its shape).
        self.answers.install(events)
        events.register_last("after-call", self.call_faults.after_call)
        self.grants = moto_guard(self)
        self.grants.install(aws.session())
        if self.memory_dynamodb is not None:
            # After the hooks: the handlers' DynamoDB clients carry them as moto's would.
            serve_dynamodb_from(aws.session(), self.memory_dynamodb)
        LocalAws._active.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        if LocalAws.disposable_process:
            # A forked run's process ends with os._exit right after: tearing the emulator down
            # (freeing its clients, resetting moto) is work for nothing; the contract check stays.
            if not (exc and isinstance(exc[1], ContractViolation)):
                self.requests.raise_if_violated()
            return
        if self in LocalAws._active:
            LocalAws._active.remove(self)
        aws.reset()
        gr_clock.reset_clock()
        self.hooks.clear()
        if self._saved_endpoint_time is not None:
            botocore.endpoint.time = self._saved_endpoint_time
            self._saved_endpoint_time = None
        state_manager.unset_transition("ecs::task")
        if self._mock is not None:
            self._mock.stop()
            self._mock = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()
        self._clients.clear()
        self.memory_dynamodb = None
        if not (exc and isinstance(exc[1], ContractViolation)):
            self.requests.raise_if_violated()

    def use_tag_lookup_queue(self) -> str:
        """Name the tag lookup queue in the handlers' environment (``TAG_LOOKUP_QUEUE_URL``),
        as the stack does for the task handler, unless the caller's ``extra_env`` named one;
        the wiring does it when it wires the queue's worker (without it, unknown tasks are
        described inline). Returns the URL."""
        url = self._settings.get(C.ENV_TAG_LOOKUP_QUEUE_URL, self.tag_lookup_queue_url)
        self._set_env({C.ENV_TAG_LOOKUP_QUEUE_URL: url})
        return url

    def _set_env(self, values: dict[str, str]) -> None:
        for key, value in values.items():
            if key not in self._saved_env:
                self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value
            self.env[key] = value

    def client(self, service: str) -> Any:
        """Internal client: bypasses the hooks and fault injection."""
        assert self._session is not None, "use inside `with LocalAws()`"
        with self._client_lock:
            if service not in self._clients:
                self._clients[service] = self._session.client(service, region_name=REGION)
            return self._clients[service]

    def resource(self, service: str) -> Any:
        """Internal resource (e.g. DynamoDB tables to inspect): no hooks, no faults."""
        assert self._session is not None, "use inside `with LocalAws()`"
        with self._client_lock:
            key = f"resource:{service}"
            if key not in self._clients:
                self._clients[key] = self._session.resource(service, region_name=REGION)
            return self._clients[key]

    def _create_resources(self) -> None:
        # Setup code written before LocalAws provided the node-token / idempotency tables
        # creates them itself (registered before the first internal client exists).
        self._session.events.register(  # type: ignore[union-attr]
            "before-call.dynamodb.CreateTable", self._tolerate_create_table
        )
        ddb = self.client("dynamodb")
        defs = C.table_definitions()
        for kind, name in (("job", self.job_table), ("instance", self.instance_table),
                           ("node_token", self.node_token_table), ("quota", self.quota_table)):
            ddb.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", **defs[kind])
        ddb.create_table(
            TableName=self.idempotency_table,
            BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        )
        with contextlib.suppress(Exception):  # TTL is optional in the emulator
            ddb.update_time_to_live(
                TableName=self.idempotency_table,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": "expiration"},
            )
        self._provisioned_tables = {self.node_token_table, self.idempotency_table}
        sns, sqs = self.client("sns"), self.client("sqs")
        self.topic_arn = sns.create_topic(Name=TOPIC_NAME)["TopicArn"]
        self.queue_url = sqs.create_queue(QueueName=QUEUE_NAME)["QueueUrl"]
        self.gang_queue_url = sqs.create_queue(QueueName=GANG_QUEUE_NAME)["QueueUrl"]
        self.tag_lookup_queue_url = sqs.create_queue(QueueName=TAG_LOOKUP_QUEUE_NAME)["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        sns.subscribe(
            TopicArn=self.topic_arn,
            Protocol="sqs",
            Endpoint=queue_arn,
            Attributes={"RawMessageDelivery": "false"},
        )
        ecs = self.client("ecs")
        ecs.create_cluster(clusterName=self.cluster_name)
        self.health_check_task_definition_arn = ecs.register_task_definition(
            family=C.DEFAULT_HEALTH_CHECK_FAMILY,
            requiresCompatibilities=["EC2"],
            networkMode="host",
            containerDefinitions=[
                {
                    "name": C.HEALTH_CHECK_CONTAINER_NAME,
                    "image": "nvcr.io/nvidia/cloud-native/dcgm:latest",
                    "memory": 1024,
                    "essential": True,
                    "command": ["/opt/health_check/dcgm_health_check.sh"],
                    "resourceRequirements": [
                        {"type": "GPU", "value": str(self.health_check_gpus)}
                    ],
                    "logConfiguration": {
                        "logDriver": "awslogs",
                        "options": {
                            "awslogs-group": HEALTH_CHECK_LOG_GROUP,
                            "awslogs-region": REGION,
                            "awslogs-stream-prefix": C.HEALTH_CHECK_LOG_STREAM_PREFIX,
                        },
                    },
                }
            ],
        )["taskDefinition"]["taskDefinitionArn"]
        # The GPU reset task (recovery.gpu_resets): every GPU of the node, like the check.
        self.gpu_reset_task_definition_arn = ecs.register_task_definition(
            family=C.DEFAULT_GPU_RESET_FAMILY, requiresCompatibilities=["EC2"], networkMode="host",
            containerDefinitions=[{
                "name": "gpu-reset", "image": "nvcr.io/nvidia/cloud-native/dcgm:latest", "memory": 512,
                "essential": True, "privileged": True, "command": ["/opt/health_check/gpu_reset.sh"],
                "resourceRequirements": [{"type": "GPU", "value": str(self.health_check_gpus)}],
            }],
        )["taskDefinition"]["taskDefinitionArn"]
        self.client("logs").create_log_group(logGroupName=HEALTH_CHECK_LOG_GROUP)
        self._set_env(
            {
                C.ENV_SNS_TOPIC_ARN: self.topic_arn,
                C.ENV_HEALTH_CHECK_TASK: self.health_check_task_definition_arn,
                C.ENV_GPU_RESET_TASK: self.gpu_reset_task_definition_arn,
                C.ENV_GANG_QUEUE_URL: self._settings.get(C.ENV_GANG_QUEUE_URL, self.gang_queue_url),
            }
        )

    def _tolerate_create_table(self, params: dict[str, Any], **_: Any) -> Any:
        """Internal clients: CreateTable of a table LocalAws already provisioned (node
        tokens, idempotency) answers with the existing table instead of
        ResourceInUseException, so older fixtures that create it themselves still work."""
        body = params.get("body")
        try:  # moto's clients send JSON; the memory store's get the parameters themselves
            name = (body if isinstance(body, dict) else json.loads(body or b"{}")).get("TableName")
        except (TypeError, ValueError, AttributeError):
            return None
        if name not in self._provisioned_tables:
            return None
        description = self._table_description(name)
        if description is None:
            return None  # gone (deleted by the caller): a real CreateTable
        return hook_answer("dynamodb", {"TableDescription": description})

    def _table_description(self, name: str) -> dict[str, Any] | None:
        if self.memory_dynamodb is not None:
            status, described = self.memory_dynamodb.respond("DescribeTable", {"TableName": name})
            return described["Table"] if status == 200 else None
        try:
            from moto.dynamodb.models import dynamodb_backends

            table = dynamodb_backends[ACCOUNT_ID][REGION].get_table(name)
        except Exception:
            return None
        return table.describe(base_key="TableDescription")["TableDescription"]  # type: ignore[no-any-return]

    # --- notifications -----------------------------------------------------------
    def notifications(self) -> list[dict[str, Any]]:
        """Every SNS notification published so far, oldest first.

        Each is ``{"subject", "message", "attributes", "message_id", "timestamp"}``;
        ``message`` is JSON-decoded when it is JSON, ``attributes`` maps name -> value.
        """
        with self._notif_lock:
            for body in self._take_inbox():
                env = json.loads(body)
                message: Any = env.get("Message", "")
                with contextlib.suppress(TypeError, ValueError):
                    message = json.loads(message)
                self._notifications.append(
                    {
                        "subject": env.get("Subject"),
                        "message": message,
                        "attributes": {
                            k: v.get("Value")
                            for k, v in (env.get("MessageAttributes") or {}).items()
                        },
                        "message_id": env.get("MessageId"),
                        "timestamp": env.get("Timestamp"),
                    }
                )
            return list(self._notifications)

    def _take_inbox(self) -> list[str]:
        """The bodies (SNS envelopes) of every message in the operators' inbox queue, taken
        out of it, oldest first. From the emulator's own queue, not ReceiveMessage and
        DeleteMessageBatch: those calls' serialization was a fifth of a broken run's fixed
        cost in the crash campaigns, which read the inbox once per run."""
        from moto.sqs.models import sqs_backends

        account, name = self.queue_url.rstrip("/").split("/")[-2:]
        queue = sqs_backends[account][REGION].get_queue(name)
        with queue._messages_lock:
            taken, queue._messages = queue._messages, []
        return [m.body for m in taken]
