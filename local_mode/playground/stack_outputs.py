"""The playground as ``gpu-recovery-admin doctor`` reads a deployed stack: its outputs, and in
the emulated account what the stack deploys that the local world does not need to run.

The emulator already holds the stack's tables, topic (with a confirmed subscription), ECS
cluster, tagged GPU nodes and health-check task definition. The local event bus routes the
events in process, so the emulator has no EventBridge rules and no dead-letter queues of
its own: this module creates them as infra deploys them (each rule of
``local_mode.sim.deployment``, ENABLED, its target's dead-letter queue; the gang queue's
redrive to its dead-letter queue), turns point-in-time recovery on for every table (the
stack does), and writes the outputs file ``cdk deploy --outputs-file`` would write, which
doctor reads (``GPU_RECOVERY_OUTPUTS_FILE``, exported by the playground). A dead letter of
the local bus is sent to its function's dead-letter queue here too (:func:`mirror_dead_letters`),
so doctor sees what the console shows.

Not emulated: the gang worker's Lambda function and event source mapping (the outputs leave
``GangWorkerFunctionName`` out: doctor says so), the health check's image (not in ECR: not
looked up, as for a deployed stack using NVIDIA's registry).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpu_recovery import constants as C
from local_mode.sim import deployment

STACK_NAME = "GpuTrainingRecovery"
#: doctor reads the stack's outputs from this file when it is set (cli/doctor/outputs.py)
OUTPUTS_FILE_ENV = C.ENV_STACK_OUTPUTS_FILE
#: each deployed function's name in the stack's outputs (infra/stack.py: ``<Name>RuleName``,
#: ``<Name>DeadLetterQueueUrl``)
OUTPUT_NAMES = {
    deployment.TASK_HANDLER: "TaskHandler",
    deployment.DCGM_MONITOR: "DcgmMonitor",
    deployment.INSTANCE_MONITOR: "InstanceMonitor",
    deployment.RECOVERY_SWEEP: "RecoverySweep",
    deployment.HEARTBEAT_SWEEP: "HeartbeatSweep",
    deployment.QUEUE_SCHEDULER: "QueueScheduler",
    deployment.GANG_WORKER: "GangWorker",
    deployment.TAG_LOOKUP_WORKER: "TagLookupWorker",
}


def create_stack_resources(local: Any, *, cluster_arn: str, tag_key: str) -> dict[str, str]:
    """Create the rules, their dead-letter queues and the gang queue's redrive in the emulated
    account, turn PITR on; return the stack's outputs."""
    events, sqs, ddb = local.client("events"), local.client("sqs"), local.client("dynamodb")
    outputs = {
        "ClusterName": local.cluster_name, "InstanceTagKey": tag_key,
        "InstanceTagValue": local.cluster_name, "AlertTopicArn": local.topic_arn,
        "HealthCheckTaskDefinitionArn": local.health_check_task_definition_arn,
        "JobTableName": local.job_table, "InstanceTableName": local.instance_table,
        "NodeTokenTableName": local.node_token_table, "IdempotencyTableName": local.idempotency_table,
        "QuotaTableName": local.quota_table, "GangQueueUrl": local.gang_queue_url,
    }
    account = cluster_arn.split(":")[4]
    dlq_arns: dict[str, str] = {}
    for function, name in OUTPUT_NAMES.items():
        url = sqs.create_queue(QueueName=f"{STACK_NAME}-{name}Dlq")["QueueUrl"]
        dlq_arns[function] = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
            "Attributes"]["QueueArn"]
        outputs[f"{name}DeadLetterQueueUrl"] = url
    # Each function's own rule, as the stack outputs name them (a function's further rules, AWS's
    # notices to the instance monitor, are not in the outputs: infra/recovery.py extra_rules).
    firsts = {rule.function: rule for rule in reversed(deployment.RULES)}
    rules: list[tuple[str, str, dict[str, Any]]] = [
        (rule.function, rule.name, {"EventPattern": json.dumps(rule.pattern(cluster_arn))})
        for rule in deployment.RULES if firsts[rule.function] is rule]
    rules += [(schedule.function, schedule.name,
               {"ScheduleExpression": f"rate({int(schedule.every_seconds // 60)} minute"
                                      f"{'s' if schedule.every_seconds > 60 else ''})"})
              for schedule in deployment.ALL_SCHEDULES]
    for function, rule_name, how in rules:
        name = OUTPUT_NAMES[function]
        full = f"{STACK_NAME}-{name}Rule"
        events.put_rule(Name=full, State="ENABLED", Description=f"{rule_name} -> {function}", **how)
        events.put_targets(Rule=full, Targets=[{
            "Id": "Target0", "Arn": f"arn:aws:lambda:{local.region}:{account}:function:{STACK_NAME}-{name}",
            "DeadLetterConfig": {"Arn": dlq_arns[function]},
            "RetryPolicy": {"MaximumRetryAttempts": 185, "MaximumEventAgeInSeconds": 7200}}])
        outputs[f"{name}RuleName"] = full
    gang_dlq = outputs[f"{OUTPUT_NAMES[deployment.GANG_WORKER]}DeadLetterQueueUrl"]
    sqs.set_queue_attributes(QueueUrl=local.gang_queue_url, Attributes={"RedrivePolicy": json.dumps({
        "deadLetterTargetArn": dlq_arns[deployment.GANG_WORKER],
        "maxReceiveCount": str(deployment.GANG_QUEUE.max_receives)})})
    outputs["GangWorkerDeadLetterQueueUrl"] = gang_dlq
    for table in (local.job_table, local.instance_table, local.node_token_table, local.idempotency_table,
                  local.quota_table):
        ddb.update_continuous_backups(TableName=table, PointInTimeRecoverySpecification={
            "PointInTimeRecoveryEnabled": True})
    return outputs


def write_outputs_file(outputs: dict[str, str], stem: Path) -> Path:
    """The outputs as ``cdk deploy --outputs-file`` writes them ({stack: {key: value}}), in
    ``<stem>-outputs.json``."""
    path = stem.with_name(f"{stem.name}-outputs.json")
    path.write_text(json.dumps({STACK_NAME: outputs}, indent=2, sort_keys=True) + "\n")
    return path


def mirror_dead_letters(local: Any, outputs: dict[str, str], dead_letters: list[Any]) -> None:
    """Each new dead letter of the local bus, as a message in its function's dead-letter queue."""
    sqs = local.client("sqs")
    by_function = {function: outputs.get(f"{name}DeadLetterQueueUrl")
                   for function, name in OUTPUT_NAMES.items()}
    for dead in dead_letters:
        url = by_function.get(str(dead.target))
        if url:
            sqs.send_message(QueueUrl=url, MessageBody=json.dumps(
                {"requestPayload": dead.event, "error": str(dead.error)[:1000]}, default=str))
