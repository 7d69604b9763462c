"""``gpu-recovery-admin doctor`` against the emulator: a ready account, then a broken one.

The account is the local emulator's (LocalAws: tables, topic with a confirmed
subscription, cluster, health-check task definition and its log group) plus what
``cdk deploy`` adds there (rules with their DLQs, point-in-time recovery), the simulated
ECS data plane's GPU nodes (two EC2, one ECS Anywhere), node tokens issued with the
admin CLI and one report per node through the node API. moto has no SSM managed
instances: the simulation answers for the ``mi-`` host as SSM does
(``local_mode.sim.managed_instances``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber

from cli import doctor
from cli.admin import COMMANDS, build_parser, main
from gpu_recovery import constants as C
from gpu_recovery import event_patterns as patterns

TAG_KEY = "gpu-recovery:cluster"


@dataclass
class Account:
    local: Any
    sim: Any
    ssm: Any  # the simulation's SSM view of the mi- hosts (local_mode.sim.managed_instances)
    outputs: dict[str, str]
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def session(self) -> Any:
        from gpu_recovery.adapters import aws

        return aws.session()

    def host(self, node: str) -> str:
        return str(self.sim.nodes[node].instance_id)

    def container_instance(self, node: str) -> str:
        return str(self.sim.nodes[node].container_instance_id)

    def findings(self, **kwargs: Any) -> list[doctor.Finding]:
        return doctor.Doctor(self.session, self.outputs, **kwargs).run()


def _deploy(local: Any) -> dict[str, str]:
    """What `cdk deploy` creates beyond LocalAws: rules + DLQs, the gang queue's DLQ and
    worker (its event source mapping), PITR; the stack's outputs."""
    sqs, events, ddb = local.client("sqs"), local.client("events"), local.client("dynamodb")
    outputs = {
        "ClusterName": local.cluster_name,
        "InstanceTagKey": TAG_KEY,
        "InstanceTagValue": local.cluster_name,
        "AlertTopicArn": local.topic_arn,
        "HealthCheckTaskDefinitionArn": local.health_check_task_definition_arn,
        "JobTableName": local.job_table,
        "InstanceTableName": local.instance_table,
        "NodeTokenTableName": local.node_token_table,
        "IdempotencyTableName": local.idempotency_table,
        "QuotaTableName": local.quota_table,
        "HeartbeatStaleSeconds": "180",
    }
    triggers = {
        "TaskHandler": {"EventPattern": json.dumps(patterns.training_task_pattern(local.cluster_arn))},
        "DcgmMonitor": {"EventPattern": json.dumps(patterns.health_check_task_pattern(local.cluster_arn))},
        "InstanceMonitor": {
            "EventPattern": json.dumps(patterns.container_instance_pattern(local.cluster_arn))},
        "RecoverySweep": {"ScheduleExpression": "rate(1 minute)"},
        "HeartbeatSweep": {"ScheduleExpression": "rate(1 minute)"},
        "QueueScheduler": {"ScheduleExpression": "rate(1 minute)"},
    }
    for name, trigger in triggers.items():
        url = sqs.create_queue(QueueName=f"{name}Dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        rule = f"GpuTrainingRecovery-{name}Rule"
        events.put_rule(Name=rule, **trigger)
        events.put_targets(
            Rule=rule,
            Targets=[
                {
                    "Id": "Target0",
                    "Arn": f"arn:aws:lambda:us-east-1:{local.account_id}:function:{name}",
                    "DeadLetterConfig": {"Arn": dlq_arn},
                    "RetryPolicy": {"MaximumRetryAttempts": 8},
                }
            ],
        )
        outputs[f"{name}RuleName"], outputs[f"{name}DeadLetterQueueUrl"] = rule, url
    outputs.update(_deploy_gang_fanout(local))
    for key in doctor.TABLE_OUTPUTS:
        ddb.update_continuous_backups(
            TableName=outputs[key], PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True}
        )
    return outputs


def _deploy_gang_fanout(local: Any) -> dict[str, str]:
    """The gang queue (LocalAws made it) with its DLQ as infra/gang.py configures them, and
    the worker function with its SQS event source mapping (moto stores the function)."""
    import io
    import zipfile

    sqs, lam = local.client("sqs"), local.client("lambda")
    dlq_url = sqs.create_queue(QueueName="GangWorkerDlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"]
    sqs.set_queue_attributes(QueueUrl=local.gang_queue_url, Attributes={
        "VisibilityTimeout": str(C.GANG_QUEUE_VISIBILITY_TIMEOUT_SECONDS),
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn,
                                     "maxReceiveCount": C.GANG_QUEUE_MAX_RECEIVES})})
    queue_arn = sqs.get_queue_attributes(QueueUrl=local.gang_queue_url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    role = local.client("iam").create_role(RoleName="GangWorkerRole", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "lambda.amazonaws.com"}}]}))
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("handlers/gang_worker.py", "def lambda_handler(event, context):\n    return {}\n")
    lam.create_function(FunctionName="GangWorker", Runtime="python3.12", Role=role["Role"]["Arn"],
                        Handler="handlers.gang_worker.lambda_handler", Code={"ZipFile": code.getvalue()},
                        Timeout=C.GANG_WORKER_TIMEOUT_SECONDS)
    lam.create_event_source_mapping(EventSourceArn=queue_arn, FunctionName="GangWorker", BatchSize=1,
                                    FunctionResponseTypes=["ReportBatchItemFailures"],
                                    ScalingConfig={"MaximumConcurrency": 4})
    return {"GangQueueUrl": local.gang_queue_url, "GangWorkerDeadLetterQueueUrl": dlq_url,
            "GangWorkerFunctionName": "GangWorker"}


@pytest.fixture
def account(capsys: pytest.CaptureFixture[str]) -> Iterator[Account]:
    from gpu_recovery.adapters import aws
    from gpu_recovery.heartbeat.tokens import TokenStore
    from local_mode.node_agents import SimulatedNodeAgents
    from local_mode.server import LocalApi
    from local_mode.world import build_world

    # No recovery Lambdas on the bus: the doctor reads the account; the node API is called directly.
    # moto's DynamoDB: the deployment turns the tables' point-in-time recovery on, which the
    # doctor reads back (the in-memory store keeps no backups).
    with build_world(handlers=False, dynamodb="moto", sim_options={"node_tag_key": TAG_KEY},
                     extra_env={"POWERTOOLS_LOG_LEVEL": "CRITICAL"}) as world:
        local, sim = world.aws, world.ecs
        for name, kind in (("node-a", "ec2"), ("node-b", "ec2"), ("node-d", "anywhere")):
            sim.add_node(name, gpus=8, kind=kind)
        ssm = sim.managed_instances
        for host in ssm.hosts():
            ssm.set_tags(host.instance_id, {TAG_KEY: local.cluster_name, "Name": "node-d"})
        acct = Account(local, sim, ssm, _deploy(local))
        # Tokens as an operator issues them (the admin CLI), then one report per node
        # through the node API (authorizer + handler), as each node agent sends it.
        store = TokenStore(aws.resource("dynamodb").Table(local.node_token_table))
        for name in ("node-a", "node-b", "node-d"):
            assert main(["issue-token", "--node-id", acct.container_instance(name)], store=store) == 0
            acct.tokens[name] = capsys.readouterr().out.strip()
        agents, api = SimulatedNodeAgents(sim, "http://127.0.0.1:9"), LocalApi()
        sim.run_for(20)
        for name, token in acct.tokens.items():
            response = api.handle(
                "POST",
                "/v1/report_tasks",
                {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                json.dumps(agents.body(name)).encode(),
            )
            assert response.status == 200, response.body
        sim.run_for(30)
        yield acct


def _by_check(findings: list[doctor.Finding]) -> dict[str, list[doctor.Finding]]:
    out: dict[str, list[doctor.Finding]] = {}
    for f in findings:
        out.setdefault(f.check, []).append(f)
    return out


def _one(findings: list[doctor.Finding], check: str, status: str) -> doctor.Finding:
    matches = [f for f in findings if f.check == check and f.status == status]
    assert matches, (check, status, findings)
    return matches[0]


def test_doctor_passes_on_a_ready_account(
    account: Account, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given the emulator's account with everything the recovery loop needs, When doctor
    runs from `cdk deploy --outputs-file`, Then every check passes and it exits 0."""
    findings = account.findings()
    failing = [f for f in findings if f.status != doctor.PASS]
    assert not failing, failing
    checks = {f.check for f in findings}
    assert {
        "cluster",
        "GPU instances",
        "reboot tag",
        "SSM reachability",
        "health check",
        "alerts",
        "tables PITR",
        "node tokens",
        "breaker",
        "gang queue",
        "overdue jobs",
    } <= checks
    assert {
        f"rule {name}"
        for name in (
            "TaskHandler",
            "DcgmMonitor",
            "InstanceMonitor",
            "RecoverySweep",
            "HeartbeatSweep",
            "QueueScheduler",
        )
    } <= checks
    gpu = _one(findings, "GPU instances", doctor.PASS).detail
    assert "3 registered" in gpu and "8 GPUs" in gpu and account.host("node-d") in gpu
    assert "last reports" in _one(findings, "node tokens", doctor.PASS).detail
    assert "gpu-health-check:1 ACTIVE" in _one(findings, "health check", doctor.PASS).detail
    gang = _one(findings, "gang queue", doctor.PASS).detail
    assert "dead-letter queue empty" in gang and "GangWorker Enabled (at most 4 at once)" in gang
    tables = _one(findings, "tables PITR", doctor.PASS).detail
    assert f"on for all {len(doctor.TABLE_OUTPUTS)}" in tables and account.local.quota_table in tables

    outputs_file = tmp_path / "outputs.json"
    outputs_file.write_text(json.dumps({"GpuTrainingRecovery": account.outputs}))
    code = main(
        ["doctor", "--outputs-file", str(outputs_file), "--cluster", account.local.cluster_name],
        session=account.session,
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "FAIL" not in out and "fix:" not in out
    assert out.strip().splitlines()[-1].startswith(f"{len(findings)} passed, 0 warnings, 0 failed")


def test_doctor_names_each_problem_of_a_broken_account(
    account: Account, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given an account with one thing broken per check, When doctor runs, Then each problem
    is a FAIL (or WARN) naming the resource, with a fix, and the exit status is 1."""
    local, sim = account.local, account.sim
    local.client("ec2").delete_tags(Resources=[account.host("node-b")], Tags=[{"Key": TAG_KEY}])
    mi = account.host("node-d")
    account.ssm.set_tags(mi, {})
    account.ssm.offline.add(mi)
    sim.add_node("node-c", gpus=4)  # too small for the 8-GPU health check, and no token
    local.client("logs").delete_log_group(logGroupName="/ecs/gpu-health-check")
    local.hooks.on_after_call("sns", "ListSubscriptionsByTopic", _pending_confirmation)
    local.client("events").disable_rule(Name=account.outputs["TaskHandlerRuleName"])
    local.client("sqs").send_message(
        QueueUrl=account.outputs["RecoverySweepDeadLetterQueueUrl"],
        MessageBody=json.dumps({"requestPayload": {"detail-type": "Scheduled Event"}}),
    )
    local.client("dynamodb").update_continuous_backups(
        TableName=local.instance_table, PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": False}
    )
    _trip_the_breaker(local)
    # A batch that failed every receive, and the worker's event source mapping disabled.
    local.client("sqs").send_message(QueueUrl=account.outputs["GangWorkerDeadLetterQueueUrl"],
                                     MessageBody=json.dumps({"op": "start", "job_id": "big", "first": 0}))
    lam = local.client("lambda")
    (mapping,) = lam.list_event_source_mappings(FunctionName="GangWorker")["EventSourceMappings"]
    lam.update_event_source_mapping(UUID=mapping["UUID"], Enabled=False)
    sim.run_for(600)  # node reports are now 10 minutes old
    # The quota table deleted by hand (after the simulation, whose scheduler reads it).
    local.client("dynamodb").delete_table(TableName=local.quota_table)

    findings = account.findings(expected_cluster="other-cluster")
    cluster = _one(findings, "cluster", doctor.FAIL)
    assert "'other-cluster'" in cluster.detail and "-c cluster_name=other-cluster" in cluster.fix
    tag = _one(findings, "reboot tag", doctor.FAIL)
    assert (
        account.host("node-b") in tag.detail and mi in tag.detail and account.host("node-a") not in tag.detail
    )
    assert f"aws ec2 create-tags --resources {account.host('node-b')}" in tag.fix
    assert f"--resource-id {mi}" in tag.fix
    ssm = _one(findings, "SSM reachability", doctor.FAIL)
    assert f"{mi} (ConnectionLost)" in ssm.detail and "amazon-ssm-agent" in ssm.fix
    health = [f.detail for f in findings if f.check == "health check" and f.status == doctor.FAIL]
    assert any("log group /ecs/gpu-health-check does not exist" in d for d in health)
    assert any(account.container_instance("node-c") + " (4)" in d for d in health)
    alerts = _one(findings, "alerts", doctor.FAIL)
    assert "no confirmed subscription" in alerts.detail and "pending confirmation" in alerts.detail
    assert "aws sns subscribe" in alerts.fix
    disabled = _one(findings, "rule TaskHandler", doctor.FAIL)
    assert "DISABLED" in disabled.detail and "aws events enable-rule" in disabled.fix
    dlq = _one(findings, "rule RecoverySweep", doctor.FAIL)
    assert "1 message(s)" in dlq.detail and "docs/operations.md" in dlq.fix
    assert _one(findings, "rule DcgmMonitor", doctor.PASS)
    pitr = [f for f in findings if f.check == "tables PITR" and f.status == doctor.FAIL]
    (off,) = [f for f in pitr if "point-in-time recovery is off" in f.detail]
    assert local.instance_table in off.detail and local.job_table not in off.detail
    assert "update-continuous-backups" in off.fix
    (gone,) = [f for f in pitr if f.detail.startswith("not found")]
    assert local.quota_table in gone.detail and local.job_table not in gone.detail
    assert "redeploy" in gone.fix.lower()
    no_token = _one(findings, "node tokens", doctor.FAIL)
    assert account.container_instance("node-c") in no_token.detail and "issue-token" in no_token.fix
    silent = _one(findings, "node tokens", doctor.WARN)
    assert "10 min ago" in silent.detail and account.container_instance("node-a") in silent.detail
    tripped = _one(findings, "breaker", doctor.FAIL)
    assert "tripped" in tripped.detail and "node-z" in tripped.detail and "breaker reset" in tripped.fix
    gang = {f.detail: f.fix for f in findings if f.check == "gang queue" and f.status == doctor.FAIL}
    (stuck,) = [d for d in gang if "in its dead-letter queue" in d]
    assert stuck.startswith("1 batch(es)")
    assert "start-message-move-task --source-arn arn:aws:sqs:" in gang[stuck]
    (disabled_mapping,) = [d for d in gang if "event source mapping" in d]
    assert "Disabled" in disabled_mapping
    assert f"update-event-source-mapping --uuid {mapping['UUID']} --enabled" in gang[disabled_mapping]

    code = main(
        ["doctor", *[f"--output={k}={v}" for k, v in account.outputs.items()]], session=account.session
    )
    out = capsys.readouterr().out
    assert code == 1
    assert out.count("FAIL") >= 10 and "fix: aws events enable-rule" in out


def _trip_the_breaker(local: Any) -> None:
    """Three node actions in one window of a 4-node cluster: the third is held back."""
    from gpu_recovery import clock
    from gpu_recovery.domain.breaker import breaker
    from gpu_recovery.repository import Repository

    repo = Repository(local.resource("dynamodb"), local.job_table, local.instance_table)
    state = None
    for i, node in enumerate(("node-x", "node-y", "node-z")):
        decided = breaker.record_action(state, node=node, action="reboot", now=clock.now() - 60 + i,
                                        cluster_gpu_nodes=4)
        assert repo.breaker.save(decided.state, None if state is None else state["version"])
        state = decided.state
    assert state is not None and state["state"] == breaker.TRIPPED


def _pending_confirmation(params: Any, status: int, parsed: dict[str, Any], context: Any) -> None:
    """An e-mail subscription nobody confirmed: AWS lists it with this placeholder ARN."""
    for sub in parsed.get("Subscriptions", []):
        sub.update(SubscriptionArn="PendingConfirmation", Protocol="email", Endpoint="oncall@example.com")


def test_doctor_on_a_missing_cluster_skips_what_depends_on_it(account: Account) -> None:
    """Given outputs naming a cluster that does not exist, Then cluster FAILs with the fix and
    the instance checks are skipped rather than reported as passing."""
    account.outputs["ClusterName"] = "deleted-cluster"
    findings = _by_check(account.findings())
    assert findings["cluster"][0].status == doctor.FAIL and "deleted-cluster" in findings["cluster"][0].detail
    for check in ("GPU instances", "reboot tag", "SSM reachability", "node tokens"):
        assert [f.status for f in findings[check]] == [doctor.SKIP]


def test_doctor_without_node_tokens_warns_that_heartbeats_are_off(account: Account) -> None:
    """Given no node has a report token (the node agent is optional), Then a WARN, not a FAIL."""
    from gpu_recovery.heartbeat.tokens import TokenStore

    store = TokenStore(account.local.resource("dynamodb").Table(account.local.node_token_table))
    for name in account.tokens:
        assert store.revoke(account.container_instance(name))
    (finding,) = [f for f in account.findings() if f.check == "node tokens"]
    assert finding.status == doctor.WARN and "heartbeats" in finding.detail


def test_doctor_reads_the_outputs_of_a_stack_and_names_missing_ones() -> None:
    """Given a stack name, Then the outputs come from CloudFormation DescribeStacks; outputs of
    an older stack lack the doctor's keys: a FAIL asking for a redeploy, the rest SKIP."""
    import boto3

    session = boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1")
    client = session.client("cloudformation")
    stubber = Stubber(client)
    stubber.add_response(
        "describe_stacks",
        {
            "Stacks": [
                {
                    "StackName": "GpuTrainingRecovery",
                    "CreationTime": "2026-01-01T00:00:00Z",
                    "StackStatus": "UPDATE_COMPLETE",
                    "Outputs": [
                        {"OutputKey": "JobTableName", "OutputValue": "jobs"},
                        {"OutputKey": "AlertTopicArn", "OutputValue": "arn:aws:sns:us-east-1:1:t"},
                    ],
                }
            ]
        },
        {"StackName": "GpuTrainingRecovery"},
    )

    class OneClient:
        region_name = "us-east-1"

        def client(self, service: str, **_: Any) -> Any:
            assert service == "cloudformation"
            return client

    with stubber:
        outputs = doctor.stack_outputs(OneClient(), "GpuTrainingRecovery")
    assert outputs == {"JobTableName": "jobs", "AlertTopicArn": "arn:aws:sns:us-east-1:1:t"}
    args = build_parser().parse_args(["doctor", "--output", "ClusterName=c"])
    assert args.output == ["ClusterName=c"] and args.stack_name == "GpuTrainingRecovery"
    findings = doctor.Doctor(None, {}).run()
    assert findings[0].check == "stack outputs" and findings[0].status == doctor.FAIL
    assert "ClusterName" in findings[0].detail and "redeploy" in findings[0].fix
    assert {f.status for f in findings[1:]} <= {doctor.SKIP, doctor.FAIL}


def test_admin_commands_are_a_registry() -> None:
    """Every command is one registry entry; the parser is built from the registry."""
    names = [c.name for c in COMMANDS]
    assert {"doctor", "issue-token", "revoke-token", "list-tokens", "quota"} <= set(names)
    assert len(names) == len(set(names))
    parser = build_parser()
    required = {"issue-token": ["--node-id", "n1"], "revoke-token": ["--node-id", "n1"],
                "breaker": ["show"], "quota": ["list"], "faults": ["--job-id", "j"],
                "inject-fault": ["nodes"], "uncordon": ["--node-id", "n1"],
                "return-node": ["--node-id", "n1"]}
    for name in names:
        parser.parse_args([name, *required.get(name, [])])


def test_doctor_checks_that_the_gang_queue_sends_failures_to_its_dlq(account: Account) -> None:
    """Given a gang queue without its redrive policy (a batch failing forever would never
    reach the DLQ nor page), Then a FAIL naming both queues; an older stack without the gang
    outputs skips the check."""
    account.local.client("sqs").set_queue_attributes(QueueUrl=account.outputs["GangQueueUrl"],
                                                     Attributes={"RedrivePolicy": ""})
    (finding,) = [f for f in account.findings() if f.check == "gang queue"]
    assert finding.status == doctor.FAIL and "does not send failing batches" in finding.detail
    assert account.outputs["GangWorkerDeadLetterQueueUrl"] in finding.detail and "redeploy" in finding.fix
    for key in (doctor.GANG_QUEUE, doctor.GANG_DLQ, doctor.GANG_WORKER):
        account.outputs.pop(key)
    (skipped,) = [f for f in account.findings() if f.check == "gang queue"]
    assert skipped.status == doctor.SKIP and "GangQueueUrl" in skipped.detail


def test_doctor_lists_the_jobs_past_their_due_time(account: Account,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Given jobs in recovery: one whose next step is 40 minutes late (nothing moved it on),
    one due a minute ago (the next sweep takes it), one not due yet, When doctor runs, Then
    only the first is a FAIL, with its id, state, how late and its last error, and the fix
    pointing to the runbook; ten overdue jobs are listed oldest first, the rest counted."""
    from gpu_recovery import clock
    from gpu_recovery.domain.models import Job
    from gpu_recovery.domain.states import JobState
    from gpu_recovery.repository import Repository

    local = account.local
    repo = Repository(local.resource("dynamodb"), local.job_table, local.instance_table)
    now = clock.now()

    def in_recovery(job_id: str, deadline_at: float) -> None:
        job = Job(job_id, JobState.RUNNING, world_size=2, created_at=now - 7200)
        assert repo.registrations.create_job_if_absent(job)
        assert repo.rank_events.enter_recovery(job_id, 1, from_states=[JobState.RUNNING], now=now - 3600,
                                               reason="rank 1 exited 1 on node-b (suspect GPU fault)",
                                               deadline_at=deadline_at)

    in_recovery("stuck", now - 40 * 60)
    in_recovery("due", now - 60)
    in_recovery("waiting", now + 60)
    (finding,) = [f for f in account.findings() if f.check == "overdue jobs"]
    assert finding.status == doctor.FAIL
    assert finding.detail == ("stuck: PENDING_HEALTHCHECK (attempt 1), next step due 40 min ago; last error: "
                              "rank 1 exited 1 on node-b (suspect GPU fault)")
    assert "sweep step failed" in finding.fix and "docs/operations.md 'Overdue jobs'" in finding.fix

    code = main(["doctor", *[f"--output={k}={v}" for k, v in account.outputs.items()]],
                session=account.session)
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL  overdue jobs" in out and "fix: nothing has moved these jobs on for 15 min" in out

    for i in range(9):
        in_recovery(f"late-{i}", now - 20 * 60 - i)
    listed = [f for f in account.findings() if f.check == "overdue jobs"]
    assert [f.detail.split(":")[0] for f in listed[:doctor.LISTED]] == \
        ["stuck", *[f"late-{i}" for i in range(8, 1, -1)]]  # oldest first
    assert [bool(f.fix) for f in listed[:2]] == [True, False]  # the fix once
    assert listed[-1].detail == "and 2 more job(s) overdue"
    assert len(listed) == doctor.LISTED + 1
