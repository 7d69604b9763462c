"""``EcsCluster``: one ECS cluster of the scale simulator, its control-plane API and its
boto3-shaped client (:class:`EcsClient`), so the project's real ``EcsAdapter`` runs on it;
the data plane (nodes, task lifecycle, reboots, DCGM verdicts, events) is
:class:`~local_mode.sim.ecs_cluster_data_plane.ClusterDataPlane`.

StartTask on named container instances (up to 10 per call, one task each; ``failures`` with
reason ``RESOURCE:GPU`` when the GPUs are taken, ``AGENT`` when the agent is disconnected,
``MISSING`` for an unknown instance, HTTP 200 as ECS answers); StopTask; DescribeTasks (tags
with ``include=["TAGS"]``), ListTasks (``startedBy``, ``desiredStatus``,
``containerInstance``, ``family``; 100 a page), DescribeContainerInstances /
ListContainerInstances, UpdateContainerInstancesState (DRAINING), Put/DeleteAttributes
(the stack's cordon). Every client call goes through
:class:`~local_mode.sim.aws_calls.SimClient` (validation, the account's rate limits and
botocore's standard retries, latency, statistics).

Not modelled: RunTask, services, task-definition registration through the API.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .aws_calls import ClientFailure, StandInClient
from .ecs_cluster_data_plane import ClusterDataPlane
from .ecs_model import MISSING, Node, Task, list_tasks_refusal, start_task_network_refusal

PAGE_SIZE = 100
MAX_START_INSTANCES = 10


class EcsCluster(ClusterDataPlane):
    """One ECS cluster in simulated time: the data plane and the control-plane API."""

    def client(self) -> EcsClient:
        """A new client (one per Lambda container: its own botocore retry quota)."""
        return EcsClient(self)

    def start_task(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        refs = list(p["containerInstances"])
        if not 1 <= len(refs) <= MAX_START_INSTANCES:
            raise ClientFailure("InvalidParameterException",
                                 f"containerInstances can have at most {MAX_START_INSTANCES} items.")
        tags = list(p.get("tags") or [])
        if any(str(t.get("key", "")).lower().startswith("aws:") for t in tags):
            raise ClientFailure("InvalidParameterException",
                                 "Tag keys beginning with 'aws:' are reserved for AWS use.")
        definition = self._definition(p["taskDefinition"])
        refused = start_task_network_refusal(definition.network_mode, p)
        if refused:
            raise ClientFailure("InvalidParameterException", refused)
        started_by = str(p.get("startedBy") or "")
        if len(started_by) > 36:
            raise ClientFailure("InvalidParameterException", "startedBy can have at most 36 characters.")
        tasks, failures = [], []
        for ref in refs:
            node = self._by_ref.get(ref)
            if node is None:
                failures.append({"arn": ref, "reason": MISSING})
                continue
            failure = self._placement_failure(node, definition)
            if failure:
                failures.append({"arn": node.container_instance_arn, "reason": failure})
                self.counters[f"start_failure:{failure}"] += 1
                continue
            overrides = dict(p.get("overrides") or {})
            task = self._place(definition, node, tags, started_by, p.get("group"), overrides)
            tasks.append(self.describe(task, tags=False))
        return {"tasks": tasks, "failures": failures}

    def stop_task(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        task = self._task(p["task"])
        if task is None:
            raise ClientFailure("InvalidParameterException", "The referenced task was not found.")
        self.counters["stop_requests"] += 1
        self._request_stop(task, str(p.get("reason") or "Task stopped by user"))
        return {"task": self.describe(task, tags=False)}

    def describe_tasks(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        refs = list(p["tasks"])
        if len(refs) > 100:
            raise ClientFailure("InvalidParameterException", "Tasks cannot be more than 100.")
        with_tags = "TAGS" in (p.get("include") or [])
        tasks, failures = [], []
        for ref in refs:
            task = self._task(ref)
            if task is None:
                failures.append({"arn": ref, "reason": "MISSING"})
            else:
                tasks.append(self.describe(task, tags=with_tags))
        return {"tasks": tasks, "failures": failures}

    def list_tasks(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        refused = list_tasks_refusal(p)
        if refused:
            raise ClientFailure("InvalidParameterException", refused)
        desired = p.get("desiredStatus") or "RUNNING"  # ECS's default filter
        if p.get("startedBy"):
            candidates: Iterable[Task] = (self.tasks[a]
                                                 for a in self._started_by.get(p["startedBy"], []))
        else:
            candidates = self.tasks.values()
        node = self._by_ref.get(p["containerInstance"]) if p.get("containerInstance") else None
        family = p.get("family")
        arns = [t.arn for t in candidates
                if t.desired_status == desired or (desired == "STOPPED" and t.done)
                if (node is None or t.node == node.name) and (family is None or t.family == family)]
        return _page(arns, p, "taskArns")

    def describe_container_instances(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        refs = list(p["containerInstances"])
        if len(refs) > 100:
            raise ClientFailure("InvalidParameterException", "Container instances cannot be more than 100.")
        found, failures = [], []
        for ref in refs:
            node = self._by_ref.get(ref)
            if node is None:
                failures.append({"arn": ref, "reason": "MISSING"})
            else:
                found.append(self.describe_instance(node))
        return {"containerInstances": found, "failures": failures}

    def list_container_instances(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        status = p.get("status")
        arns = [n.container_instance_arn for n in self.nodes.values() if status is None or n.status == status]
        return _page(arns, p, "containerInstanceArns")

    def update_container_instances_state(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        status = p["status"]
        if status not in ("ACTIVE", "DRAINING"):
            raise ClientFailure("InvalidParameterException", "Container instance status must be ACTIVE or "
                                                              "DRAINING.")
        changed, failures = [], []
        for ref in p["containerInstances"]:
            node = self._by_ref.get(ref)
            if node is None:
                failures.append({"arn": ref, "reason": "MISSING"})
                continue
            if node.status != status:
                if status == "DRAINING":
                    self.repairs.record(node, "quarantine", "UpdateContainerInstancesState DRAINING")
                node.status = status
                self.counters[f"instances_{status.lower()}"] += 1
                self._emit_instance(node)
            changed.append(self.describe_instance(node))
        return {"containerInstances": changed, "failures": failures}

    def put_attributes(self, p: dict[str, Any]) -> dict[str, Any]:
        """Custom attributes on container instances (the stack's cordon), by ARN or by id
        with ``targetType``; an unknown target fails the call as ECS does."""
        self._check_cluster(p)
        nodes = [self._attribute_target(a) for a in p["attributes"]]
        for node, attribute in zip(nodes, p["attributes"], strict=True):
            node.attributes[attribute["name"]] = attribute.get("value")
            self.repairs.attribute(node, str(attribute["name"]), attribute.get("value"))
        return {"attributes": list(p["attributes"])}

    def delete_attributes(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        nodes = [self._attribute_target(a) for a in p["attributes"]]
        for node, attribute in zip(nodes, p["attributes"], strict=True):
            node.attributes.pop(attribute["name"], None)
            self.repairs.attribute(node, str(attribute["name"]), None)
        return {"attributes": list(p["attributes"])}

    def _attribute_target(self, attribute: dict[str, Any]) -> Node:
        ref = str(attribute.get("targetId") or "")
        node = self._by_ref.get(ref)
        if node is None:
            raise ClientFailure("TargetNotFoundException", f"Could not find {ref}.")
        return node

    def _task(self, ref: str) -> Task | None:
        task = self.tasks.get(ref)
        if task is None and "/" not in ref:
            task = next((t for a, t in self.tasks.items() if a.endswith("/" + ref)), None)
        return task


def _page(items: list[str], p: dict[str, Any], key: str) -> dict[str, Any]:
    size = int(p.get("maxResults") or PAGE_SIZE)
    if not 1 <= size <= PAGE_SIZE:
        raise ClientFailure("InvalidParameterException", f"maxResults must be between 1 and {PAGE_SIZE}.")
    start = int(p.get("nextToken") or 0)
    out: dict[str, Any] = {key: items[start:start + size]}
    if start + size < len(items):
        out["nextToken"] = str(start + size)
    return out



class EcsClient(StandInClient):
    service = "ecs"

    def __init__(self, cluster: EcsCluster) -> None:
        super().__init__(cluster.account)
        self.cluster = cluster

    def _latency(self, operation: str) -> float:
        latencies = self.account.latencies
        return latencies.ecs_control if operation in self.account.ECS_CONTROL else latencies.ecs_read

    def start_task(self, **params: Any) -> dict[str, Any]:
        return self._run("StartTask", params, self.cluster.start_task)

    def stop_task(self, **params: Any) -> dict[str, Any]:
        return self._run("StopTask", params, self.cluster.stop_task)

    def describe_tasks(self, **params: Any) -> dict[str, Any]:
        return self._run("DescribeTasks", params, self.cluster.describe_tasks)

    def list_tasks(self, **params: Any) -> dict[str, Any]:
        return self._run("ListTasks", params, self.cluster.list_tasks)

    def describe_container_instances(self, **params: Any) -> dict[str, Any]:
        return self._run("DescribeContainerInstances", params, self.cluster.describe_container_instances)

    def list_container_instances(self, **params: Any) -> dict[str, Any]:
        return self._run("ListContainerInstances", params, self.cluster.list_container_instances)

    def update_container_instances_state(self, **params: Any) -> dict[str, Any]:
        return self._run("UpdateContainerInstancesState", params,
                         self.cluster.update_container_instances_state)

    def put_attributes(self, **params: Any) -> dict[str, Any]:
        return self._run("PutAttributes", params, self.cluster.put_attributes)

    def delete_attributes(self, **params: Any) -> dict[str, Any]:
        return self._run("DeleteAttributes", params, self.cluster.delete_attributes)
