"""Stand-ins of the other AWS services the recovery loop calls, for the scale simulator:
boto3-shaped clients of EC2 (RebootInstances), SSM (SendCommand of the reboot document),
CloudWatch Logs (GetLogEvents) and SNS (Publish to the operators' topic), so the project's
real ``RebootAdapter``, ``VerdictLogReader`` and ``SnsNotifier`` run on them. Each call goes
through :class:`~local_mode.sim.aws_calls.SimClient` (latency and statistics; these services'
rate limits are not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C

from ..events import ACCOUNT_ID, REGION
from .aws_calls import Account, ClientFailure, StandInClient
from .ecs_cluster import EcsCluster
from .log_pages import InvalidLogToken, LogPaging, log_page
from .log_store import LogStore

SNS_MAX_MESSAGE_BYTES = 256 * 1024


class Ec2Client(StandInClient):
    """RebootInstances (the RebootAdapter's EC2 path)."""

    service = "ec2"
    modeled = False

    def __init__(self, cluster: EcsCluster) -> None:
        super().__init__(cluster.account)
        self.cluster = cluster

    def reboot_instances(self, **params: Any) -> dict[str, Any]:
        def run(p: dict[str, Any]) -> dict[str, Any]:
            if set(p) - {"InstanceIds", "DryRun"} or not isinstance(p.get("InstanceIds"), list):
                raise ClientFailure("InvalidParameterValue",
                                     f"RebootInstances: invalid parameters {sorted(p)}")
            nodes = []
            for instance_id in p["InstanceIds"]:
                node = self.cluster._by_ref.get(instance_id)
                if node is None or node.kind != "ec2":
                    raise ClientFailure("InvalidInstanceID.NotFound",
                                         f"The instance ID '{instance_id}' does not exist")
                nodes.append(node)
            for node in nodes:
                self.cluster.reboot(node)
            return {}

        return self._run("RebootInstances", params, run)


class SsmClient(StandInClient):
    """SendCommand of the reboot-only document (the RebootAdapter's ECS Anywhere path)."""

    service = "ssm"

    def __init__(self, cluster: EcsCluster, reboot_document: str = C.DEFAULT_REBOOT_DOCUMENT_NAME) -> None:
        super().__init__(cluster.account)
        self.cluster = cluster
        self.reboot_document = reboot_document

    def send_command(self, **params: Any) -> dict[str, Any]:
        def run(p: dict[str, Any]) -> dict[str, Any]:
            if p["DocumentName"] != self.reboot_document:
                raise ClientFailure("InvalidDocument", f"Document {p['DocumentName']} does not exist")
            nodes = []
            for instance_id in p.get("InstanceIds") or []:
                node = self.cluster._by_ref.get(instance_id)
                if node is None or node.kind != "anywhere":
                    raise ClientFailure("InvalidInstanceId", "Instances not in a valid state for account")
                nodes.append(node)
            for node in nodes:
                self.cluster.reboot(node)
            return {"Command": {"CommandId": self.sim.token(), "DocumentName": p["DocumentName"],
                                "InstanceIds": list(p.get("InstanceIds") or []), "Status": "Pending"}}

        return self._run("SendCommand", params, run)


class LogsClient(StandInClient):
    """GetLogEvents (the VerdictLogReader), paged as CloudWatch Logs pages
    (``local_mode.sim.log_pages``: partial and empty pages, lines readable ``visible_after``
    seconds after they were written)."""

    service = "logs"

    def __init__(self, account: Account, store: LogStore, paging: LogPaging | None = None) -> None:
        super().__init__(account)
        self.store = store
        self.paging = paging or LogPaging()
        self._calls = 0

    def get_log_events(self, **params: Any) -> dict[str, Any]:
        def run(p: dict[str, Any]) -> dict[str, Any]:
            events = self.store.streams.get((p["logGroupName"], p["logStreamName"]))
            if events is None:
                raise ClientFailure("ResourceNotFoundException", "The specified log stream does not exist.")
            self._calls += 1
            every = self.paging.empty_every
            try:
                written = [{**e, "ingestedAt": e["ingestionTime"] / 1000} for e in events]
                return log_page(written, p, now=self.sim.now, paging=self.paging,
                                empty=bool(every and self._calls % every == 0), nonce=self._calls)
            except InvalidLogToken as error:
                raise ClientFailure("InvalidParameterException", str(error)) from None

        return self._run("GetLogEvents", params, run)


@dataclass
class Notification:
    at: float
    subject: str
    message: str
    attributes: dict[str, str]
    size: int
    label: str


@dataclass
class SnsTopic:
    """The operators' topic: what was published, and what SNS refused."""

    arn: str = f"arn:aws:sns:{REGION}:{ACCOUNT_ID}:gpu-training-notifications"
    published: list[Notification] = field(default_factory=list)
    refused: list[Notification] = field(default_factory=list)


class SnsClient(StandInClient):
    """Publish to the topic; a message over 256 KB is refused as SNS does."""

    service = "sns"

    def __init__(self, account: Account, topic: SnsTopic) -> None:
        super().__init__(account)
        self.topic = topic

    def publish(self, **params: Any) -> dict[str, Any]:
        def run(p: dict[str, Any]) -> dict[str, Any]:
            if p.get("TopicArn") != self.topic.arn:
                raise ClientFailure("NotFound", "Topic does not exist")
            raw = p.get("MessageAttributes") or {}
            attributes = {k: str(v.get("StringValue", "")) for k, v in raw.items()}
            # SNS counts the body and every attribute's name, type and value.
            size = len(p["Message"].encode()) + sum(
                len(k.encode()) + len(str(v.get("DataType", "")).encode())
                + len(str(v.get("StringValue", "")).encode()) for k, v in raw.items())
            note = Notification(self.sim.now, str(p.get("Subject") or ""), p["Message"], attributes, size,
                                self.account.label())
            if size > SNS_MAX_MESSAGE_BYTES:
                self.topic.refused.append(note)
                raise ClientFailure("InvalidParameter", "Invalid parameter: Message too long")
            self.topic.published.append(note)
            t = self.sim.token()
            return {"MessageId": f"{t[:8]}-{t[8:12]}-{t[12:16]}-{t[16:20]}-{t[20:32]}"}

        return self._run("Publish", params, run)
