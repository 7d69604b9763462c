"""``gpu-recovery-admin doctor``: is the live account ready for the first GPU fault?

Read-only. From the deployed stack's outputs (``--stack-name``, a ``cdk deploy
--outputs-file`` file, or ``--output KEY=VALUE``) it checks what the recovery loop needs
and prints one line per check, PASS / WARN / FAIL, with the fix under each failure:

* the ECS cluster exists, is ACTIVE and is the one you expect (``--cluster``);
* GPU container instances are registered (GPU count each) and carry the reboot tag the
  stack's IAM policy requires (EC2 tags; SSM tags for ECS Anywhere ``mi-`` hosts);
* ECS Anywhere hosts are reachable through SSM (how the stack reboots them);
* the health-check task definition is registered and ACTIVE, its image, its log group
  exists, and every GPU node has the GPUs it reserves;
* the alert topic has a confirmed subscription;
* every rule is enabled, has a dead-letter queue, and that queue is empty;
* the gang fan-out queue (a large job's stop / start batches) exists, sends what fails 5
  times to its dead-letter queue, which is empty, and its worker's event source mapping
  is enabled;
* point-in-time recovery is on for every table;
* node report tokens are issued for the registered nodes, and when each last reported;
* the blast-radius breaker is closed (a tripped breaker holds every node action back);
* no job is overdue: none of the jobs the recovery loop owns is 15 minutes or more past the
  deadline of its next step (read from the job table's deadline index, oldest first, no
  Scan); each is listed with its state, since when, and its last error.

Exit status 1 when a check fails (warnings do not fail). Credentials need read access
only (e.g. the ReadOnlyAccess managed policy).
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery import clock
from gpu_recovery.constants import DEADLINE_SK
from gpu_recovery.domain.overdue import OVERDUE_AFTER_SECONDS, overdue_cutoff
from gpu_recovery.heartbeat.tokens import ACTIVE, STATUS_ATTR, TokenStore
from gpu_recovery.repository import Repository
from gpu_recovery.repository.heartbeat import HeartbeatRepository

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
DEFAULT_STACK_NAME = "GpuTrainingRecovery"
# Outputs every check needs (stacks deployed before the doctor existed lack some).
REQUIRED_OUTPUTS = ("ClusterName", "InstanceTagKey", "InstanceTagValue", "AlertTopicArn",
                    "HealthCheckTaskDefinitionArn", "JobTableName", "InstanceTableName",
                    "NodeTokenTableName")
# Tables whose point-in-time recovery is checked (a stack from before time sharing has no
# QuotaTableName: only the tables it names are checked).
TABLE_OUTPUTS = ("JobTableName", "InstanceTableName", "NodeTokenTableName", "IdempotencyTableName",
                 "QuotaTableName")
RULE_SUFFIX, DLQ_SUFFIX = "RuleName", "DeadLetterQueueUrl"
GANG_QUEUE, GANG_DLQ, GANG_WORKER = "GangQueueUrl", "GangWorkerDeadLetterQueueUrl", "GangWorkerFunctionName"
DEPTH_ATTRIBUTES = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed"]
DEFAULT_STALE_SECONDS = 180
LISTED = 8  # names shown per line before "and N more"
# Overdue jobs: one line each for the oldest few; the deadline index is read a page at a
# time, at most this many pages (the rest is counted as "or more").
OVERDUE_PAGE, OVERDUE_MAX_PAGES = 100, 10
OVERDUE_RUNBOOK = "docs/operations.md 'Overdue jobs'"
REDEPLOY = "redeploy this version of the stack (make deploy CDK_ARGS=...)"


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class GpuNode:
    container_instance_id: str
    host_id: str  # EC2 instance id (i-...) or SSM managed instance id (mi-...)
    gpus: int
    status: str
    agent_connected: bool

    @property
    def anywhere(self) -> bool:
        return self.host_id.startswith("mi-")


class OutputsError(ValueError):
    """The stack's outputs could not be read."""


def stack_outputs(session: Any, stack_name: str) -> dict[str, str]:
    try:
        stacks = _client(session, "cloudformation").describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        raise OutputsError(f"stack {stack_name!r}: {_error_text(error)} (deployed in another "
                           "region or account? use --region / --profile)") from error
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def outputs_file(path: Path, stack_name: str) -> dict[str, str]:
    """``cdk deploy --outputs-file`` ({stack: {key: value}}) or a flat {key: value}."""
    data = json.loads(path.read_text())
    if isinstance(data.get(stack_name), dict):
        data = data[stack_name]
    elif data and all(isinstance(v, dict) for v in data.values()) and len(data) == 1:
        data = next(iter(data.values()))
    if not isinstance(data, dict):
        raise OutputsError(f"{path}: expected a JSON object of stack outputs")
    return {str(k): str(v) for k, v in data.items()}


def _client(session: Any, service: str) -> Any:
    return session.client(service, config=Config(retries={"mode": "standard", "max_attempts": 5}))


def _client_in(session: Any, service: str, region: str) -> Any:
    return session.client(service, region_name=region,
                          config=Config(retries={"mode": "standard", "max_attempts": 5}))


def _error_text(error: Exception) -> str:
    if isinstance(error, ClientError):
        info = error.response.get("Error", {})
        return f"{info.get('Code', 'Error')}: {info.get('Message', '')}".rstrip(": ")
    return f"{type(error).__name__}: {error}"


def _listing(items: Sequence[str], limit: int = LISTED) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


class Doctor:
    """The checks; ``run()`` returns one or more findings per check, never raises for AWS
    errors (an unreadable resource is a FAIL naming the error)."""

    def __init__(self, session: Any, outputs: Mapping[str, str], *,
                 expected_cluster: str | None = None,
                 now: Callable[[], float] = clock.now) -> None:
        self.session = session
        self.outputs = dict(outputs)
        self.expected_cluster = expected_cluster
        self.now = now
        self._clients: dict[str, Any] = {}
        self._nodes: list[GpuNode] | None = None
        self._cluster_ok = False

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = _client(self.session, service)
        return self._clients[service]

    def out(self, key: str) -> str:
        return self.outputs.get(key, "")

    # ------------------------------------------------------------------ runner
    def run(self) -> list[Finding]:
        findings: list[Finding] = []
        missing = [k for k in REQUIRED_OUTPUTS if not self.out(k)]
        if missing:
            findings.append(Finding("stack outputs", FAIL, f"missing {', '.join(missing)}",
                                    f"{REDEPLOY}, or pass them with --output KEY=VALUE"))
        checks: list[tuple[str, Callable[[], list[Finding]], tuple[str, ...]]] = [
            ("cluster", self.check_cluster, ("ClusterName",)),
            ("GPU instances", self.check_gpu_instances, ("ClusterName",)),
            ("reboot tag", self.check_reboot_tag, ("ClusterName", "InstanceTagKey")),
            ("SSM reachability", self.check_ssm, ("ClusterName",)),
            ("health check", self.check_health_check, ("HealthCheckTaskDefinitionArn",)),
            ("alerts", self.check_alerts, ("AlertTopicArn",)),
            ("rules", self.check_rules, ()),
            ("gang queue", self.check_gang_queue, (GANG_QUEUE, GANG_DLQ)),
            ("tables PITR", self.check_tables, ()),
            ("node tokens", self.check_node_tokens, ("NodeTokenTableName", "ClusterName")),
            ("breaker", self.check_breaker, ("InstanceTableName",)),
            ("overdue jobs", self.check_overdue_jobs, ("JobTableName",)),
        ]
        for name, check, needs in checks:
            absent = [k for k in needs if not self.out(k)]
            if absent:
                findings.append(Finding(name, SKIP, f"needs stack output {', '.join(absent)}"))
                continue
            try:
                findings.extend(check())
            except (ClientError, BotoCoreError) as error:
                findings.append(Finding(name, FAIL, f"could not read: {_error_text(error)}",
                                        "run doctor with read access to the stack's resources "
                                        "(e.g. ReadOnlyAccess) in the stack's region"))
        return findings

    # ------------------------------------------------------------------ cluster
    def check_cluster(self) -> list[Finding]:
        name = self.out("ClusterName")
        found = self.client("ecs").describe_clusters(clusters=[name]).get("clusters", [])
        status = found[0].get("status") if found else "MISSING"
        if status != "ACTIVE":
            return [Finding("cluster", FAIL, f"ECS cluster {name!r} is {status} in this region",
                            "create the cluster or redeploy with -c cluster_name=<your cluster>; "
                            "check --region / --profile")]
        self._cluster_ok = True
        if self.expected_cluster and self.expected_cluster != name:
            return [Finding("cluster", FAIL, f"the stack guards {name!r}, not {self.expected_cluster!r}",
                            f"redeploy with -c cluster_name={self.expected_cluster}")]
        count = found[0].get("registeredContainerInstancesCount", 0)
        return [Finding("cluster", PASS, f"{name} is ACTIVE ({count} container instances)")]

    def nodes(self) -> list[GpuNode]:
        """Every container instance of the cluster (GPU count 0 for CPU-only ones)."""
        if self._nodes is None:
            ecs, cluster = self.client("ecs"), self.out("ClusterName")
            arns: list[str] = []
            for page in ecs.get_paginator("list_container_instances").paginate(cluster=cluster):
                arns.extend(page.get("containerInstanceArns", []))
            nodes = []
            for chunk in _chunks(arns, 100):
                described = ecs.describe_container_instances(cluster=cluster, containerInstances=list(chunk))
                for ci in described.get("containerInstances", []):
                    gpus = sum(len(r.get("stringSetValue") or []) for r in ci.get("registeredResources", [])
                               if r.get("name") == "GPU")
                    nodes.append(GpuNode(ci["containerInstanceArn"].rsplit("/", 1)[-1],
                                         ci.get("ec2InstanceId", ""), gpus, ci.get("status", "?"),
                                         bool(ci.get("agentConnected"))))
            self._nodes = sorted(nodes, key=lambda n: n.container_instance_id)
        return self._nodes

    def gpu_nodes(self) -> list[GpuNode]:
        return [n for n in self.nodes() if n.gpus > 0]

    def check_gpu_instances(self) -> list[Finding]:
        if not self._cluster_ok:
            return [Finding("GPU instances", SKIP, "cluster not found")]
        gpu, others = self.gpu_nodes(), len(self.nodes()) - len(self.gpu_nodes())
        if not gpu:
            return [Finding("GPU instances", FAIL,
                            f"no container instance with GPUs registered ({others} without GPUs)",
                            "register GPU hosts: the ECS GPU-optimized AMI (ECS_ENABLE_GPU_SUPPORT=true)"
                            " or ECS Anywhere with --enable-gpu")]
        described = [f"{n.container_instance_id} ({n.host_id}, {n.gpus} GPUs, {n.status})" for n in gpu]
        findings = [Finding("GPU instances", PASS, f"{len(gpu)} registered: {_listing(described)}"
                            + (f"; {others} without GPUs" if others else ""))]
        disconnected = [n.container_instance_id for n in gpu if not n.agent_connected]
        if disconnected:
            findings.append(Finding("GPU instances", WARN,
                                    f"ECS agent disconnected on {_listing(disconnected)}",
                                    "a node rebooting right now is fine; otherwise check the ECS "
                                    "agent on the host (systemctl status ecs)"))
        return findings

    # ------------------------------------------------------------------ tags / SSM
    def check_reboot_tag(self) -> list[Finding]:
        if not self._cluster_ok:
            return [Finding("reboot tag", SKIP, "cluster not found")]
        key, value = self.out("InstanceTagKey"), self.out("InstanceTagValue") or self.out("ClusterName")
        gpu = self.gpu_nodes()
        if not gpu:
            return [Finding("reboot tag", SKIP, "no GPU instances")]
        ec2_ids = [n.host_id for n in gpu if n.host_id.startswith("i-")]
        tags: dict[str, dict[str, str]] = {}
        for chunk in _chunks(ec2_ids, 200):
            pages = self.client("ec2").get_paginator("describe_instances").paginate(
                Filters=[{"Name": "instance-id", "Values": list(chunk)}])
            for page in pages:
                for reservation in page.get("Reservations", []):
                    for inst in reservation.get("Instances", []):
                        tags[inst["InstanceId"]] = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
        ssm = self.client("ssm")
        for node in (n for n in gpu if n.anywhere):
            listed = ssm.list_tags_for_resource(ResourceType="ManagedInstance", ResourceId=node.host_id)
            tags[node.host_id] = {t["Key"]: t["Value"] for t in listed.get("TagList", [])}
        untagged = [n for n in gpu if tags.get(n.host_id, {}).get(key) != value]
        if not untagged:
            return [Finding("reboot tag", PASS, f"all {len(gpu)} GPU instances carry {key}={value}")]
        fixes = []
        ec2_missing = [n.host_id for n in untagged if not n.anywhere]
        mi_missing = [n.host_id for n in untagged if n.anywhere]
        if ec2_missing:
            fixes.append(f"aws ec2 create-tags --resources {' '.join(ec2_missing)} "
                         f"--tags 'Key={key},Value={value}' (and in the launch template)")
        for host in mi_missing:
            fixes.append(f"aws ssm add-tags-to-resource --resource-type ManagedInstance "
                         f"--resource-id {host} --tags 'Key={key},Value={value}'")
        return [Finding("reboot tag", FAIL,
                        f"{len(untagged)} of {len(gpu)} GPU instances lack {key}={value}, so the stack "
                        f"may not reboot them: {_listing([n.host_id for n in untagged])}",
                        "; ".join(fixes))]

    def check_ssm(self) -> list[Finding]:
        if not self._cluster_ok:
            return [Finding("SSM reachability", SKIP, "cluster not found")]
        hosts = [n.host_id for n in self.gpu_nodes() if n.anywhere]
        if not hosts:
            return [Finding("SSM reachability", PASS, "no ECS Anywhere hosts (EC2 hosts reboot through EC2)")]
        status: dict[str, str] = {}
        ssm = self.client("ssm")
        for chunk in _chunks(hosts, 50):
            pages = ssm.get_paginator("describe_instance_information").paginate(
                Filters=[{"Key": "InstanceIds", "Values": list(chunk)}])
            for page in pages:
                for info in page.get("InstanceInformationList", []):
                    status[info["InstanceId"]] = info.get("PingStatus", "?")
        offline = [f"{h} ({status.get(h, 'not registered with SSM')})" for h in hosts
                   if status.get(h) != "Online"]
        if offline:
            return [Finding("SSM reachability", FAIL,
                            f"{len(offline)} ECS Anywhere hosts cannot be rebooted: {_listing(offline)}",
                            "check the SSM agent on each host (systemctl status amazon-ssm-agent) and its "
                            "route to ssm.<region>.amazonaws.com")]
        return [Finding("SSM reachability", PASS, f"all {len(hosts)} ECS Anywhere hosts Online in SSM")]

    # ------------------------------------------------------------------ health check
    def check_health_check(self) -> list[Finding]:
        reference = self.out("HealthCheckTaskDefinitionArn")
        try:
            task_def = self.client("ecs").describe_task_definition(taskDefinition=reference)["taskDefinition"]
        except ClientError as error:
            return [Finding("health check", FAIL, f"task definition {reference}: {_error_text(error)}",
                            f"{REDEPLOY}; with your own (health_check_task_arn), register it first")]
        name = f"{task_def['family']}:{task_def['revision']}"
        if task_def.get("status") != "ACTIVE":
            return [Finding("health check", FAIL, f"task definition {name} is {task_def.get('status')}",
                            f"{REDEPLOY} (it registers a new revision)")]
        container = (task_def.get("containerDefinitions") or [{}])[0]
        image = container.get("image", "?")
        gpus = sum(int(r.get("value", 0)) for r in container.get("resourceRequirements", [])
                   if r.get("type") == "GPU")
        findings = []
        log_group = ((container.get("logConfiguration") or {}).get("options") or {}).get("awslogs-group")
        if not log_group:
            findings.append(Finding("health check", FAIL, f"{name} has no awslogs log group: the verdict "
                                    "line cannot be read", "use the awslogs log driver (the stack's does)"))
        else:
            logs = self.client("logs")
            groups = logs.describe_log_groups(logGroupNamePrefix=log_group).get("logGroups", [])
            if not any(g.get("logGroupName") == log_group for g in groups):
                findings.append(Finding(
                    "health check", FAIL, f"log group {log_group} does not exist",
                    f"aws logs create-log-group --log-group-name {log_group}, or {REDEPLOY}"))
        findings.extend(self._image_findings(image))
        too_small = [f"{n.container_instance_id} ({n.gpus})" for n in self.gpu_nodes()
                     if self._cluster_ok and n.gpus < gpus]
        if too_small:
            findings.append(Finding("health check", FAIL,
                                    f"it reserves {gpus} GPUs; these nodes have fewer and can never be "
                                    f"checked: {_listing(too_small)}",
                                    "deploy with -c health_check_gpus=<GPUs of your smallest node>"))
        if not any(f.status == FAIL for f in findings):
            findings.insert(0, Finding("health check", PASS,
                                       f"{name} ACTIVE, image {image}, {gpus} GPUs, logs to {log_group}"))
        return findings

    def _image_findings(self, image: str) -> list[Finding]:
        """Only an ECR image can be looked up; others are pulled by each host from its registry."""
        host, _, rest = image.partition("/")
        parts = host.split(".")  # <account>.dkr.ecr.<region>.amazonaws.com
        if len(parts) < 5 or parts[1:3] != ["dkr", "ecr"] or not rest:
            return []
        if "@" in rest:
            repository, digest = rest.split("@", 1)
            image_id = {"imageDigest": digest}
        else:
            repository, _, tag = rest.partition(":")
            image_id = {"imageTag": tag or "latest"}
        ecr = _client_in(self.session, "ecr", parts[3])
        try:
            ecr.describe_images(registryId=parts[0], repositoryName=repository, imageIds=[image_id])
        except ClientError as error:
            return [Finding("health check", FAIL, f"image {image}: {_error_text(error)}",
                            "push the DCGM image to that repository, or deploy with "
                            "-c health_check_image=...")]
        return []

    # ------------------------------------------------------------------ alerts
    def check_alerts(self) -> list[Finding]:
        topic = self.out("AlertTopicArn")
        sns = self.client("sns")
        try:
            sns.get_topic_attributes(TopicArn=topic)
        except ClientError as error:
            return [Finding("alerts", FAIL, f"topic {topic}: {_error_text(error)}", REDEPLOY)]
        confirmed, pending = [], []
        for page in sns.get_paginator("list_subscriptions_by_topic").paginate(TopicArn=topic):
            for sub in page.get("Subscriptions", []):
                target = f"{sub.get('Protocol')}:{sub.get('Endpoint')}"
                if str(sub.get("SubscriptionArn", "")).startswith("arn:"):
                    confirmed.append(target)
                elif sub.get("SubscriptionArn") == "PendingConfirmation":
                    pending.append(target)
        if confirmed:
            return [Finding("alerts", PASS,
                            f"{len(confirmed)} confirmed subscription(s): {_listing(confirmed)}"
                            + (f"; pending: {_listing(pending)}" if pending else ""))]
        detail = "no confirmed subscription: nobody gets the alerts" + (
            f" (pending confirmation: {_listing(pending)})" if pending else "")
        return [Finding("alerts", FAIL, detail,
                        "click the link in the AWS Notification e-mail (check spam), or subscribe: "
                        f"aws sns subscribe --topic-arn {topic} --protocol email "
                        "--notification-endpoint <you@example.com>")]

    # ------------------------------------------------------------------ rules and DLQs
    def check_rules(self) -> list[Finding]:
        names = sorted(k[: -len(RULE_SUFFIX)] for k in self.outputs if k.endswith(RULE_SUFFIX))
        if not names:
            return [Finding("rules", FAIL, "the stack outputs name no rule", REDEPLOY)]
        return [self._check_rule(name) for name in names]

    def _check_rule(self, name: str) -> Finding:
        check, rule = f"rule {name}", self.out(name + RULE_SUFFIX)
        events = self.client("events")
        try:
            state = events.describe_rule(Name=rule).get("State")
        except ClientError as error:
            return Finding(check, FAIL, f"{rule}: {_error_text(error)}", REDEPLOY)
        if state != "ENABLED":
            return Finding(check, FAIL, f"{rule} is {state}: its events are dropped",
                           f"aws events enable-rule --name {rule}")
        targets = events.list_targets_by_rule(Rule=rule).get("Targets", [])
        if not targets or any("Arn" not in (t.get("DeadLetterConfig") or {}) for t in targets):
            return Finding(check, FAIL, f"{rule}: a target has no dead-letter queue", REDEPLOY)
        url = self.out(name + DLQ_SUFFIX)
        if not url:
            return Finding(check, WARN, f"{rule} ENABLED; its DLQ is not in the stack outputs", REDEPLOY)
        attrs = self.client("sqs").get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                          "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        depth = sum(int(v) for v in attrs.values())
        if depth:
            return Finding(check, FAIL, f"{depth} message(s) in its dead-letter queue: events or ticks "
                           "that failed every retry",
                           f"read them (aws sqs receive-message --queue-url {url} "
                           "--max-number-of-messages 10), fix the cause, replay or purge: "
                           "docs/operations.md 'Dead-letter queues'")
        return Finding(check, PASS, f"{rule} ENABLED, dead-letter queue empty")

    # ------------------------------------------------------------------ gang fan-out
    def check_gang_queue(self) -> list[Finding]:
        check, sqs = "gang queue", self.client("sqs")
        url, dlq_url = self.out(GANG_QUEUE), self.out(GANG_DLQ)
        try:
            attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        except ClientError as error:
            return [Finding(check, FAIL, f"{url}: {_error_text(error)}: a large job's ranks cannot be "
                            "stopped or restarted", REDEPLOY)]
        try:
            dlq = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn", *DEPTH_ATTRIBUTES])[
                "Attributes"]
        except ClientError as error:
            return [Finding(check, FAIL, f"its dead-letter queue {dlq_url}: {_error_text(error)}", REDEPLOY)]
        findings = []
        redrive = json.loads(attrs.get("RedrivePolicy") or "{}")
        if redrive.get("deadLetterTargetArn") != dlq.get("QueueArn"):
            findings.append(Finding(check, FAIL, f"{url} does not send failing batches to {dlq_url} "
                                    f"(redrive policy: {redrive or 'none'})", REDEPLOY))
        stuck = sum(int(dlq.get(k, 0)) for k in DEPTH_ATTRIBUTES)
        if stuck:
            findings.append(Finding(
                check, FAIL, f"{stuck} batch(es) in its dead-letter queue: ranks of a large job that "
                "were not stopped or started",
                f"read them (aws sqs receive-message --queue-url {dlq_url}), fix the cause from the "
                f"gang worker's ERROR log lines, then move them back: aws sqs start-message-move-task "
                f"--source-arn {dlq.get('QueueArn')} (docs/operations.md 'Dead-letter queues')"))
        worker = self._gang_worker_finding(attrs.get("QueueArn", ""))
        if worker.status != PASS:
            findings.append(worker)
        if findings:
            return findings
        waiting = int(attrs.get("ApproximateNumberOfMessages", 0)) + int(
            attrs.get("ApproximateNumberOfMessagesDelayed", 0))
        running = int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0))
        return [Finding(check, PASS, f"{waiting} batch(es) waiting, {running} running; dead-letter queue "
                        f"empty; {worker.detail}")]

    def _gang_worker_finding(self, queue_arn: str) -> Finding:
        check, function = "gang queue", self.out(GANG_WORKER)
        if not function:
            return Finding(check, PASS, "worker not in the stack outputs")
        mappings = self.client("lambda").list_event_source_mappings(
            EventSourceArn=queue_arn, FunctionName=function).get("EventSourceMappings", [])
        if not mappings:
            return Finding(check, FAIL, f"no event source mapping from the queue to {function}: its "
                           "batches are never run", REDEPLOY)
        mapping = mappings[0]
        state = mapping.get("State", "?")
        if state not in ("Enabled", "Enabling", "Updating"):
            return Finding(check, FAIL, f"the event source mapping to {function} is {state}: batches wait "
                           "and a large job's stop or restart with them",
                           f"aws lambda update-event-source-mapping --uuid {mapping.get('UUID')} --enabled")
        limit = (mapping.get("ScalingConfig") or {}).get("MaximumConcurrency")
        return Finding(check, PASS, f"worker {function} {state}"
                       + (f" (at most {limit} at once)" if limit else ""))

    # ------------------------------------------------------------------ tables
    def check_tables(self) -> list[Finding]:
        tables = [self.out(k) for k in TABLE_OUTPUTS if self.out(k)]
        if not tables:
            return [Finding("tables PITR", FAIL, "the stack outputs name no table", REDEPLOY)]
        ddb = self.client("dynamodb")
        off, missing = [], []
        for table in tables:
            try:
                described = ddb.describe_continuous_backups(TableName=table)["ContinuousBackupsDescription"]
            except ClientError as error:
                missing.append(f"{table} ({_error_text(error)})")
                continue
            pitr = described.get("PointInTimeRecoveryDescription") or {}
            if pitr.get("PointInTimeRecoveryStatus") != "ENABLED":
                off.append(table)
        findings = []
        if missing:
            findings.append(Finding("tables PITR", FAIL, f"not found: {_listing(missing)}", REDEPLOY))
        if off:
            findings.append(Finding(
                "tables PITR", FAIL, f"point-in-time recovery is off on {_listing(off)}",
                "; ".join(f"aws dynamodb update-continuous-backups --table-name {t} "
                          "--point-in-time-recovery-specification PointInTimeRecoveryEnabled=true"
                          for t in off)))
        if not findings:
            findings.append(Finding("tables PITR", PASS, f"on for all {len(tables)}: {_listing(tables)}"))
        return findings

    # ------------------------------------------------------------------ node tokens
    def check_node_tokens(self) -> list[Finding]:
        if not self._cluster_ok:
            return [Finding("node tokens", SKIP, "cluster not found")]
        resource = self.session.resource("dynamodb", config=Config(retries={"mode": "standard"}))
        store = TokenStore(resource.Table(self.out("NodeTokenTableName")))
        active = {str(i.get("node_id")) for i in store.list() if i.get(STATUS_ATTR) == ACTIVE}
        nodes = [n.container_instance_id for n in self.gpu_nodes()]
        if not nodes:
            return [Finding("node tokens", SKIP, "no GPU instances")]
        issue = (f"gpu-recovery-admin issue-token --table {self.out('NodeTokenTableName')} --node-id <id> "
                 "on each node (agent/README.md)")
        with_token = [n for n in nodes if n in active]
        if not with_token:
            return [Finding("node tokens", WARN, f"none of the {len(nodes)} GPU nodes has a report token: "
                            "node heartbeats (NODE_LOST, HUNG, hardware signals) are off", issue)]
        findings = []
        without = [n for n in nodes if n not in active]
        if without:
            findings.append(Finding("node tokens", FAIL, f"{len(without)} of {len(nodes)} GPU nodes have no "
                                    f"report token: {_listing(without)}", issue))
        repo = HeartbeatRepository(Repository(resource, self.out("JobTableName") or "-",
                                              self.out("InstanceTableName")))
        items = repo.node_items(with_token)
        stale_after = float(self.out("HeartbeatStaleSeconds") or DEFAULT_STALE_SECONDS)
        now, reports, silent = self.now(), [], []
        for node in with_token:
            last = (items.get(node) or {}).get("last_report_at")
            if last is None:
                silent.append(f"{node} (never reported)")
                continue
            age = now - float(last)
            reports.append(f"{node} {_ago(age)}")
            if age > stale_after:
                silent.append(f"{node} (last report {_ago(age)})")
        if silent:
            findings.append(Finding("node tokens", WARN, f"{len(silent)} node(s) with a token are not "
                                    f"reporting: {_listing(silent)}",
                                    "check the node agent (systemctl status gpu-node-agent) and "
                                    "its token file"))
        if not without:
            findings.insert(0, Finding("node tokens", PASS, f"all {len(nodes)} GPU nodes have a token; "
                                       f"last reports: {_listing(reports) or 'none yet'}"))
        return findings

    # ------------------------------------------------------------------ breaker
    def check_breaker(self) -> list[Finding]:
        from gpu_recovery.domain.breaker import breaker

        resource = self.session.resource("dynamodb", config=Config(retries={"mode": "standard"}))
        repo = Repository(resource, self.out("JobTableName") or "-", self.out("InstanceTableName"))
        stored = repo.get_breaker()
        state = breaker.normalize(stored)
        if state["state"] != breaker.TRIPPED:
            acted = "never acted" if stored is None else f"tripped {state['trips']} time(s) so far"
            return [Finding("breaker", PASS, f"closed ({acted})")]
        held = sorted({str(e.get("node")) for e in state["backlog"]})
        return [Finding("breaker", FAIL, f"tripped ({state['trip_reason'] or 'no reason recorded'}): node "
                        f"actions are held back; backlog: {_listing(held) or 'empty'}",
                        "find the common cause (a driver or image rollout?) with `gpu-recovery-admin "
                        "breaker show`, then `gpu-recovery-admin breaker reset --resume-backlog` "
                        "(or --drop-backlog); docs/remediation.md")]

    # ------------------------------------------------------------------ overdue jobs
    def check_overdue_jobs(self) -> list[Finding]:
        """Jobs whose next step is long past due: the deadline index up to the cutoff,
        oldest first (only overdue items are read)."""
        resource = self.session.resource("dynamodb", config=Config(retries={"mode": "standard"}))
        repo = Repository(resource, self.out("JobTableName"), self.out("InstanceTableName") or "-")
        now = self.now()
        jobs: list[dict[str, Any]] = []
        last_page_full = False  # then there may be more than were read
        for page in itertools.islice(repo.due_job_item_pages(overdue_cutoff(now), OVERDUE_PAGE),
                                     OVERDUE_MAX_PAGES):
            jobs += [item for item in page if item.get("item_type") == "JOB"]
            last_page_full = len(page) == OVERDUE_PAGE
        margin = f"{OVERDUE_AFTER_SECONDS // 60} min"
        if not jobs:
            return [Finding("overdue jobs", PASS, f"none: every job in recovery is within {margin} of its "
                            "next step's deadline")]
        fix = (f"nothing has moved these jobs on for {margin}: check that the recovery sweep runs (rule "
               "RecoverySweep above, its Errors alarm), read its ERROR lines 'sweep step failed' (the "
               "failed call's traceback), fix the cause: the next sweep goes on by itself; else settle "
               f"the job by hand ({OVERDUE_RUNBOOK})")
        findings = []
        for item in jobs[:LISTED]:
            late = now - float(item.get(DEADLINE_SK) or now)
            history = item.get("history") or [{}]
            why = str(item.get("last_error") or history[-1].get("reason") or "no error recorded")
            state = f"{item.get('job_state')} (attempt {item.get('attempt', 1)})"
            findings.append(Finding("overdue jobs", FAIL, f"{item.get('job_id')}: {state}, next step due "
                                    f"{_ago(late)}; last error: {why[:200]}", fix if not findings else ""))
        if len(jobs) > LISTED:
            more = f"{len(jobs) - LISTED}{' or more' if last_page_full else ''}"
            findings.append(Finding("overdue jobs", FAIL, f"and {more} more job(s) overdue"))
        return findings


# ---------------------------------------------------------------------- output
def render(findings: Sequence[Finding], header: str = "") -> str:
    width = max([len(f.check) for f in findings] + [5])
    lines = [header] if header else []
    for f in findings:
        lines.append(f"{f.status:<4}  {f.check:<{width}}  {f.detail}")
        if f.fix and f.status in (FAIL, WARN):
            lines.append(f"{'':<4}  {'':<{width}}  fix: {f.fix}")
    counts = {s: sum(1 for f in findings if f.status == s) for s in (PASS, WARN, FAIL, SKIP)}
    lines.append(f"{counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failed"
                 + (f", {counts[SKIP]} skipped" if counts[SKIP] else ""))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack-name", default=DEFAULT_STACK_NAME,
                        help=f"deployed stack whose outputs to read (default {DEFAULT_STACK_NAME})")
    parser.add_argument("--outputs-file", type=Path,
                        help="read the outputs from `cdk deploy --outputs-file` instead of CloudFormation")
    parser.add_argument("--output", action="append", default=[], metavar="KEY=VALUE",
                        help="an output value (overrides; with every required key, no stack is read)")
    parser.add_argument("--cluster", help="the ECS cluster you expect the stack to guard")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def resolve_outputs(args: argparse.Namespace, session: Any) -> dict[str, str]:
    given: dict[str, str] = {}
    for pair in args.output:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise OutputsError(f"--output {pair!r}: expected KEY=VALUE")
        given[key] = value
    if args.outputs_file is not None:
        return {**outputs_file(args.outputs_file, args.stack_name), **given}
    if all(k in given for k in REQUIRED_OUTPUTS):
        return given
    return {**stack_outputs(session, args.stack_name), **given}


def run(args: argparse.Namespace, session: Any, print_fn: Callable[[str], None] = print) -> int:
    try:
        outputs = resolve_outputs(args, session)
    except OutputsError as error:
        print_fn(f"doctor: {error}")
        return 2
    findings = Doctor(session, outputs, expected_cluster=args.cluster).run()
    if args.json:
        print_fn(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        region = getattr(session, "region_name", None) or "?"
        print_fn(render(findings, f"gpu-recovery-admin doctor: stack {args.stack_name}, cluster "
                                  f"{outputs.get('ClusterName', '?')}, region {region}"))
    return 1 if any(f.status == FAIL for f in findings) else 0
