"""The grants guard of each world: what it knows of the account (:class:`~.authorization.Facts`)
and how the grants file's placeholders resolve there.

* the moto world (:func:`moto_guard`, installed by ``LocalAws``): the emulator's tables,
  topic and queues; resource tags, task definitions and Auto Scaling groups read from the
  emulated account with the emulator's own clients (never hooked, never broken);
* the scale world (:func:`scale_guard`, installed by ``ScaleWorld``): its tables, topic,
  queues and cluster. Its nodes carry no tags in the model: every node of the cluster counts
  as tagged with the cluster tag (the deployment's requirement of its GPU hosts).

The deployed topic is KMS-encrypted (infra/notifications.py), the emulated ones are not: the
guard holds Publish to the alert topic to the deployed key's grants all the same.
"""

from __future__ import annotations

import os
from typing import Any

from gpu_recovery import constants as C

from ...events import ACCOUNT_ID, REGION
from ...health_verdicts import HEALTH_CHECK_LOG_GROUP
from .grants import INSTANCE_TAG_KEY, GrantsGuard, resolver

ALERT_KEY = "alerts"  # the key symbol of the alert topic (grants_file.stack_symbols)
GPU_RESET_LOG_GROUP = "/gpu-recovery/gpu-reset"


def _partition_keys(tables: dict[str, str]) -> dict[str, str]:
    """table name -> its partition key attribute."""
    definitions = C.table_definitions()
    keys: dict[str, str] = {}
    for kind, name in tables.items():
        schema = definitions.get(kind, {}).get("KeySchema") or [{"AttributeName": "id", "KeyType": "HASH"}]
        keys[name] = next(k["AttributeName"] for k in schema if k["KeyType"] == "HASH")
    return keys


class MotoFacts:
    """The emulated account of a ``LocalAws`` (read with its internal clients)."""

    def __init__(self, local: Any, tag_key: str = INSTANCE_TAG_KEY) -> None:
        self.local = local
        self.region, self.account, self.cluster = local.region, local.account_id, local.cluster_name
        self.tag_key = tag_key
        self._keys = _partition_keys({"job": local.job_table, "instance": local.instance_table,
                                      "node_token": local.node_token_table, "quota": local.quota_table,
                                      "idempotency": local.idempotency_table})
        self._definitions: dict[str, dict[str, Any]] = {}

    def partition_key(self, table: str) -> str | None:
        return self._keys.get(table)

    def resource_tags(self, arn: str) -> dict[str, str] | None:
        resource = arn.rsplit("/", 1)[-1]
        try:
            if ":ec2:" in arn and "instance/" in arn:
                # moto's tag store, read directly: what its DescribeTags with this resource-id
                # answers, without an emulated API call for every reboot the guard checks
                from moto.ec2.models import ec2_backends

                return dict(ec2_backends[self.account][self.region].tags.get(resource) or {})
            if ":ssm:" in arn and "managed-instance/" in arn:
                # moto models no managed instances: their tags are in its tag store only
                from moto.ssm.models import ssm_backends

                backend = ssm_backends[self.account][self.region]
                store: Any = backend._resource_tags
                return dict(store.get("ManagedInstance", {}).get(resource, {}))
            if ":autoscaling:" in arn:
                groups = self.local.client("autoscaling").describe_auto_scaling_groups(
                    AutoScalingGroupNames=[resource])["AutoScalingGroups"]
                return {t["Key"]: t["Value"] for g in groups for t in g.get("Tags", [])}
        except Exception:  # an unknown resource has no tags
            return {}
        return {}

    def _describe(self, reference: str) -> dict[str, Any]:
        found = self._definitions.get(reference)
        if found is None:
            found = self._definition(reference)
            if reference.startswith("arn:"):  # a revision never changes; a family's latest may
                self._definitions[reference] = found
        return found

    def _definition(self, reference: str) -> dict[str, Any]:
        """What the guard reads of a task definition (its ARN and roles), from moto's ECS
        backend directly: the fields its DescribeTaskDefinition answers, without an emulated
        API call for every StartTask the guard checks (~2 % of a crash campaign's run)."""
        from moto.ecs.models import ecs_backends

        try:
            definition = ecs_backends[self.account][self.region].describe_task_definition(reference)
        except Exception:
            return {"taskDefinitionArn": reference}
        found = {"taskDefinitionArn": definition.arn,  # moto sets the roles only when given
                 "taskRoleArn": getattr(definition, "task_role_arn", None),
                 "executionRoleArn": getattr(definition, "execution_role_arn", None)}
        return {k: v for k, v in found.items() if v}

    def task_definition_arn(self, reference: str) -> str:
        if reference.startswith("arn:"):
            return reference
        return str(self._describe(reference).get("taskDefinitionArn")
                   or f"arn:aws:ecs:{self.region}:{self.account}:task-definition/{reference}")

    def task_definition_roles(self, arn: str) -> list[str]:
        described = self._describe(arn)
        return [str(described[k]) for k in ("taskRoleArn", "executionRoleArn") if described.get(k)]

    def topic_key(self, topic_arn: str) -> str | None:
        if topic_arn != self.local.topic_arn:
            return None
        return f"arn:aws:kms:{self.region}:{self.account}:key/{ALERT_KEY}-topic-key"

    def auto_scaling_group_of(self, instance_id: str) -> str | None:
        client = self.local.client("autoscaling")
        try:
            found = client.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
            if not found:
                return None
            group = client.describe_auto_scaling_groups(
                AutoScalingGroupNames=[found[0]["AutoScalingGroupName"]])["AutoScalingGroups"][0]
        except Exception:
            return None
        return str(group["AutoScalingGroupARN"])


def moto_guard(local: Any) -> GrantsGuard:
    """The guard of a ``LocalAws`` (entered: its resources exist)."""
    resolve = resolver(
        region=local.region, account=local.account_id, cluster=local.cluster_name,
        tables={"job": local.job_table, "instance": local.instance_table, "quota": local.quota_table,
                "node_token": local.node_token_table, "idempotency": local.idempotency_table},
        topic_arn=local.topic_arn,
        queues={"gang": local.gang_queue_url, "tag-lookups": local.tag_lookup_queue_url},
        log_groups={"health-check": local.env.get(C.ENV_HEALTH_CHECK_LOG_GROUP) or HEALTH_CHECK_LOG_GROUP,
                    "gpu-reset": GPU_RESET_LOG_GROUP},
        reboot_document=os.environ.get(C.ENV_REBOOT_DOCUMENT) or C.DEFAULT_REBOOT_DOCUMENT_NAME)
    return GrantsGuard(MotoFacts(local), resolve)


class ScaleFacts:
    """The scale world's account: its tables, topic and cluster (nodes tagged with the cluster tag)."""

    def __init__(self, world: Any, tag_key: str = INSTANCE_TAG_KEY) -> None:
        self.world = world
        self.region, self.account, self.cluster = REGION, ACCOUNT_ID, world.cluster.name
        self.tag_key = tag_key
        self._keys = _partition_keys({"job": world.settings.job_table,
                                      "instance": world.settings.instance_table})

    def partition_key(self, table: str) -> str | None:
        return self._keys.get(table)

    def resource_tags(self, arn: str) -> dict[str, str] | None:
        node = self.world.cluster._by_ref.get(arn.rsplit("/", 1)[-1])
        return {self.tag_key: self.cluster} if node is not None else {}

    def task_definition_arn(self, reference: str) -> str:
        try:
            return str(self.world.cluster._definition(reference).arn)
        except Exception:
            return reference

    def task_definition_roles(self, arn: str) -> list[str]:
        return []  # the scale world's task definitions have no roles

    def topic_key(self, topic_arn: str) -> str | None:
        if topic_arn != self.world.topic.arn:
            return None
        return f"arn:aws:kms:{self.region}:{self.account}:key/{ALERT_KEY}-topic-key"

    def auto_scaling_group_of(self, instance_id: str) -> str | None:
        return None


def scale_guard(world: Any) -> GrantsGuard:
    """The guard of a ``ScaleWorld`` (its queues and settings made)."""
    queues = {name: queue.url for name, queue in world.queues.items()}
    from ..deployment import GANG_QUEUE, TAG_LOOKUP_QUEUE

    resolve = resolver(
        region=REGION, account=ACCOUNT_ID, cluster=world.cluster.name,
        tables={"job": world.settings.job_table, "instance": world.settings.instance_table,
                "quota": C.DEFAULT_QUOTA_TABLE_NAME, "node_token": C.DEFAULT_NODE_TOKEN_TABLE_NAME,
                "idempotency": C.DEFAULT_IDEMPOTENCY_TABLE_NAME},
        topic_arn=world.topic.arn,
        queues={"gang": queues.get(GANG_QUEUE.name, f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT_ID}/none"),
                "tag-lookups": queues[TAG_LOOKUP_QUEUE.name]},
        log_groups={"health-check": world.settings.health_check_log_group, "gpu-reset": GPU_RESET_LOG_GROUP},
        reboot_document=world.settings.reboot_document)
    return GrantsGuard(ScaleFacts(world), resolve)
