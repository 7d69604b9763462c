"""Checks of the stack's plumbing: the alert topic, the rules and their dead-letter
queues, the gang fan-out queue and its worker, point-in-time recovery of the tables."""

from __future__ import annotations

import json

from botocore.exceptions import ClientError

from cli.doctor.findings import FAIL, PASS, REDEPLOY, WARN, Finding, error_text, listing
from cli.doctor.outputs import (
    DLQ_SUFFIX,
    GANG_DLQ,
    GANG_QUEUE,
    GANG_WORKER,
    RULE_SUFFIX,
    TABLE_OUTPUTS,
    Account,
)

DEPTH_ATTRIBUTES = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed"]


class StackChecks(Account):
    # ------------------------------------------------------------------ alerts
    def check_alerts(self) -> list[Finding]:
        topic = self.out("AlertTopicArn")
        sns = self.client("sns")
        try:
            sns.get_topic_attributes(TopicArn=topic)
        except ClientError as error:
            return [Finding("alerts", FAIL, f"topic {topic}: {error_text(error)}", REDEPLOY)]
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
                            f"{len(confirmed)} confirmed subscription(s): {listing(confirmed)}"
                            + (f"; pending: {listing(pending)}" if pending else ""))]
        detail = "no confirmed subscription: nobody gets the alerts" + (
            f" (pending confirmation: {listing(pending)})" if pending else "")
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
            return Finding(check, FAIL, f"{rule}: {error_text(error)}", REDEPLOY)
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
            return [Finding(check, FAIL, f"{url}: {error_text(error)}: a large job's ranks cannot be "
                            "stopped or restarted", REDEPLOY)]
        try:
            dlq = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn", *DEPTH_ATTRIBUTES])[
                "Attributes"]
        except ClientError as error:
            return [Finding(check, FAIL, f"its dead-letter queue {dlq_url}: {error_text(error)}", REDEPLOY)]
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
                missing.append(f"{table} ({error_text(error)})")
                continue
            pitr = described.get("PointInTimeRecoveryDescription") or {}
            if pitr.get("PointInTimeRecoveryStatus") != "ENABLED":
                off.append(table)
        findings = []
        if missing:
            findings.append(Finding("tables PITR", FAIL, f"not found: {listing(missing)}", REDEPLOY))
        if off:
            findings.append(Finding(
                "tables PITR", FAIL, f"point-in-time recovery is off on {listing(off)}",
                "; ".join(f"aws dynamodb update-continuous-backups --table-name {t} "
                          "--point-in-time-recovery-specification PointInTimeRecoveryEnabled=true"
                          for t in off)))
        if not findings:
            findings.append(Finding("tables PITR", PASS, f"on for all {len(tables)}: {listing(tables)}"))
        return findings
