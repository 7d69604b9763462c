"""``SimulatedEcs``: the ECS data plane (GPU nodes, agents, tasks) in simulated time.

moto provides the ECS *control plane* API; this module plays the part AWS runs
behind it, driven by the API calls it observes through ``LocalAws.hooks``:

* **StartTask** — placement is checked first (``ecs_model.placement_failure``, the scale
  world's too); failing instances come back as ``failures [{"arn", "reason"}]`` (``AGENT``,
  ``RESOURCE:GPU``, ``MISSING``) with HTTP 200, like ECS. Placed tasks get GPU ids, a PENDING
  event (+1 s) and a RUNNING event (+``run_delay_seconds``), then run to their plan:
  training tasks exit 0 after ``train_seconds`` (None: run until stopped), health-
  check tasks exit with the node's DCGM verdict after ``dcgm_seconds``.
* **StopTask** — a "stopping" event now, STOPPED (stopCode UserInitiated, the given
  reason) after ``stop_delay_seconds``; GPUs are freed at STOPPED.
* **RebootInstances** (EC2) / **SendCommand** (the stack's reboot-only SSM document,
  or AWS-RunShellScript with a reboot command, ``mi-`` ids) — running tasks die (exit
  137), the agent disconnects (+15 s) and reconnects after ``reboot_seconds`` with a new boot time; health
  ``reboot_fixable`` heals, the others stay bad.
* **DescribeContainerInstances** — answers carry GPU registered/remaining
  resources and the simulated agentConnected.
* **UpdateContainerInstancesState** — emits the container-instance event.
* **DescribeInstanceInformation** / **ListTagsForResource** (SSM, the ``mi-`` nodes) —
  answered from the nodes (``managed_instances``: moto models no managed instance).
* **TerminateInstanceInAutoScalingGroup** (nodes put in a group with
  ``put_in_auto_scaling_group``) — the node's tasks die, its agent disconnects and its
  container instance is deregistered; ``replacement_seconds`` later a new node (``<name>-r1``)
  registers, as the group's new instance would.

GPU faults with XIDs (``inject_xid``) reach the stack the way the node agent reports them:
``POST /v1/report_gpu`` through the heartbeat service (``gpu_reporter``, by default the
service itself; the demo's node agents send it over HTTP), then the training tasks on the
node die. Health-check verdicts follow the node's ``health`` (exit codes 0-3 of the DCGM
health check, and its JSON verdict line in the log group).

Time never passes by itself: ``run_for`` / ``run_until`` / ``run_until_idle`` pop the
action queue in time order, deliver each emitted event to the ``EventBus`` and
fire its schedules. Events caused while a handler runs are queued, never delivered
re-entrantly. All hooks are guarded by one lock: handlers may run on many threads.

Example::

    with build_world(train_seconds=3600) as world:  # local_mode.world
        sim = world.ecs
        a, b = sim.add_node("node-a"), sim.add_node("node-b")
        td = sim.register_training_task_definition("llama", gpus=8)
        sim.start_job("llama", td, ["node-a", "node-b"])
        sim.inject_gpu_fault("node-b", after=600, health="reboot_fixable")
        sim.run_for(3600)
        print("\\n".join(sim.format_timeline()))
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from functools import partial
from typing import Any

from gpu_recovery import constants as C

from .. import cluster_query
from .. import events as ev
from ..api_hooks import hook_answer, hook_error
from ..emulator import LocalAws
from .bus import EventBus
from .ecs_faults import GpuFaults
from .ecs_model import (
    MISSING,
    Node,
    Placement,
    Task,
    list_tasks_refusal,
    placement_failure,
    start_task_network_refusal,
)
from .managed_instances import ManagedInstances

REBOOT_WORDS = ("reboot", "shutdown -r", "systemctl reboot")


class SimulatedEcs(GpuFaults):
    """The simulated ECS data plane; see the module docstring."""

    def __init__(self, local: LocalAws, bus: EventBus, **options: Any) -> None:
        """``options``: the timings and switches of :class:`~local_mode.sim.ecs_core.EcsCore`."""
        super().__init__(local, bus, **options)
        hooks = local.hooks
        hooks.on_before_call("ecs", "StartTask", self._before_start_task)
        hooks.on_after_call("ecs", "StartTask", self._after_start_task)
        hooks.on_before_call("ecs", "ListContainerInstances", self._before_list_cis)
        hooks.on_before_call("ecs", "ListTasks", self._before_list_tasks)
        hooks.on_after_call("ecs", "ListTasks", self._after_list_tasks)
        hooks.on_before_call("ecs", "DeleteAttributes", self._before_delete_attributes)
        hooks.on_after_call("ecs", "PutAttributes", self._after_put_attributes)
        hooks.on_after_call("ecs", "StopTask", self._after_stop_task)
        hooks.on_after_call("ecs", "DescribeContainerInstances", self._after_describe_cis)
        hooks.on_after_call(
            "ecs", "UpdateContainerInstancesState", self._after_update_ci_state
        )
        hooks.on_after_call("ec2", "RebootInstances", self._after_reboot_instances)
        hooks.on_before_call("ec2", "DescribeInstances", self._before_describe_instances)
        hooks.on_after_call("ssm", "SendCommand", self._after_send_command)
        hooks.on_after_call("auto-scaling", "TerminateInstanceInAutoScalingGroup",
                            self._after_terminate_in_asg)
        #: SSM's view of the ``mi-`` nodes (moto has none): their ping status, address, tags
        self.managed_instances = ManagedInstances(local, lambda: list(self.nodes.values()))

    # ================================================================ jobs (helpers)
    def register_training_task_definition(
        self, family: str, gpus: int = 8, image: str = "trainer:latest", network_mode: str = "host"
    ) -> str:
        """Register a training task definition with a GPU requirement; returns its ARN. Its
        task and execution roles carry the deployment's role prefix (``gpu-training-``, the
        stack's ``task_role_name_prefix``): whoever starts its tasks passes them
        (``iam:PassRole``, which the grants guard checks)."""
        roles = f"arn:aws:iam::{self.local.account_id}:role/gpu-training-"
        return self.local.client("ecs").register_task_definition(
            family=family,
            taskRoleArn=f"{roles}{family}"[:len(roles) + 64 - len("gpu-training-")],  # names: 64 at most
            executionRoleArn=f"{roles}execution",
            requiresCompatibilities=["EC2"],
            networkMode=network_mode,
            containerDefinitions=[
                {
                    "name": "trainer",
                    "image": image,
                    "memory": 4096,
                    "essential": True,
                    "resourceRequirements": [{"type": "GPU", "value": str(gpus)}],
                }
            ],
        )["taskDefinition"]["taskDefinitionArn"]

    def start_job(
        self,
        job_id: str,
        task_definition: str,
        nodes: list[str],
        *,
        attempt: int | None = None,
        started_by: str = "gpujobs",
        overrides: dict[str, Any] | None = None,
        extra_tags: dict[str, str] | None = None,
        network: dict[str, Any] | None = None,
    ) -> list[str]:
        """Start one rank per node through the *handler-side* ECS client (hooks see
        it), tagged with job id / rank / world size. Returns task ARNs by rank;
        raises RuntimeError on placement failures."""
        from gpu_recovery.adapters import aws

        ecs = aws.client("ecs")
        arns = []
        for rank, name in enumerate(nodes):
            tags = {C.TAG_JOB_ID: job_id, C.TAG_RANK: str(rank), C.TAG_WORLD_SIZE: str(len(nodes))}
            if attempt is not None:
                tags[C.TAG_ATTEMPT] = str(attempt)
            tags.update(extra_tags or {})
            kwargs: dict[str, Any] = {
                "cluster": self.local.cluster_name,
                "taskDefinition": task_definition,
                "containerInstances": [self.node(name).container_instance_arn],
                "startedBy": started_by,
                "tags": [{"key": k, "value": v} for k, v in tags.items()],
            }
            if overrides:
                kwargs["overrides"] = overrides
            if network:
                kwargs["networkConfiguration"] = {"awsvpcConfiguration": network}
            resp = ecs.start_task(**kwargs)
            if resp.get("failures"):
                raise RuntimeError(f"start of {job_id} rank {rank} failed: {resp['failures']}")
            arns.append(resp["tasks"][0]["taskArn"])
        return arns

    # ================================================================ API hooks
    def _gpus_needed(self, task_def_ref: str, overrides: dict[str, Any] | None) -> tuple[Any, int]:
        td = self._backend.describe_task_definition(task_def_ref)
        per_container: dict[str, int] = {}
        for cdef in td.container_definitions:
            gpus = sum(
                int(r.get("value", 0))
                for r in cdef.get("resourceRequirements") or []
                if r.get("type") == "GPU"
            )
            per_container[cdef.get("name", "")] = gpus
        for co in (overrides or {}).get("containerOverrides") or []:
            reqs = [r for r in co.get("resourceRequirements") or [] if r.get("type") == "GPU"]
            if reqs and co.get("name") in per_container:
                per_container[co["name"]] = sum(int(r.get("value", 0)) for r in reqs)
        return td, sum(per_container.values())

    def _before_list_cis(self, params: dict[str, Any], context: dict[str, Any]) -> Any:
        """ListContainerInstances with a ``filter`` (cluster query language): evaluated
        here on the instances' attributes (moto ignores it). No filter: moto answers."""
        expression = params.get("filter")
        if not expression:
            return None
        status = params.get("status")
        cis = self._backend.container_instances.get(self.local.cluster_name, {}).values()
        arns = sorted(ci.container_instance_arn for ci in cis
                      if (status is None or ci.status == status)
                      and cluster_query.matches(str(expression), dict(ci.attributes or {}),
                                                self._registered_at(ci.container_instance_arn),
                                                str(ci.ec2_instance_id or "")))
        return hook_answer("ecs", {"containerInstanceArns": arns})

    def _before_describe_instances(self, params: dict[str, Any], context: dict[str, Any]) -> Any:
        """DescribeInstances filtered by ``capacity-reservation-id`` (a Capacity Block's
        instances, docs/aws-notices.md): answered from the nodes' reservation (moto keeps none)."""
        filters = {f.get("Name"): list(f.get("Values") or []) for f in params.get("Filters") or []}
        wanted = filters.get("capacity-reservation-id")
        if not wanted:
            return None  # moto answers
        instances: list[dict[str, Any]] = [
            {"InstanceId": n.instance_id, "CapacityReservationId": n.capacity_reservation_id,
             "State": {"Code": 16, "Name": "running"}}
                     for n in sorted(self.nodes.values(), key=lambda n: n.name)
                     if n.kind == "ec2" and n.capacity_reservation_id in wanted and n.status != "INACTIVE"]
        reservations = [{"ReservationId": f"r-{str(i['InstanceId'])[2:]}", "OwnerId": self.local.account_id,
                         "Instances": [i]} for i in instances]
        return hook_answer("ec2", {"Reservations": reservations})

    def _registered_at(self, arn: str) -> float | None:
        node = self._node_or_none(arn)
        return node.registered_at if node is not None else None

    def _before_list_tasks(self, params: dict[str, Any], context: dict[str, Any]) -> Any:
        """ListTasks takes ``startedBy`` only alone, as ECS does (moto takes any mix)."""
        refused = list_tasks_refusal(params)
        return hook_error("ecs", "InvalidParameterException", refused) if refused else None

    def _after_list_tasks(self, params: dict[str, Any], status: int, parsed: dict[str, Any],
                          context: dict[str, Any]) -> None:
        """Without ``desiredStatus``, ECS lists only the tasks whose desired status is RUNNING
        (its default filter); moto lists every task: the others are dropped from its answer."""
        if status != 200 or params.get("desiredStatus"):
            return
        tasks = self._backend.tasks.get(self.local.cluster_name, {})
        parsed["taskArns"] = [arn for arn in parsed.get("taskArns", [])
                              if (t := tasks.get(arn)) is not None
                              and t.desired_status == "RUNNING"]

    def _before_delete_attributes(self, params: dict[str, Any], context: dict[str, Any]) -> Any:
        """DeleteAttributes of custom attributes by name and target, without their value, as
        ECS documents it (moto deletes only an attribute whose value matches the one given)."""
        attributes = list(params.get("attributes") or [])
        if any(a.get("value") is not None or not a.get("targetId") for a in attributes):
            return None  # moto answers
        cis = self._backend.container_instances.get(self.local.cluster_name, {})
        for attribute in attributes:
            ci = cis.get(str(attribute["targetId"]).rsplit("/", 1)[-1])
            if ci is None:
                return None  # moto answers TargetNotFoundException
        for attribute in attributes:
            cis[str(attribute["targetId"]).rsplit("/", 1)[-1]].attributes.pop(attribute["name"], None)
            node = self._node_or_none(str(attribute["targetId"]))
            if node is not None:
                self.repairs.attribute(node, str(attribute["name"]), None)
        return hook_answer("ecs", {"attributes": attributes})

    def _after_put_attributes(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        """The placement attribute's value on a node (the repair ledger's cordons)."""
        if status >= 300:
            return
        for attribute in params.get("attributes") or []:
            node = self._node_or_none(str(attribute.get("targetId") or ""))
            if node is not None:
                self.repairs.attribute(node, str(attribute.get("name")), attribute.get("value"))

    def _before_start_task(self, params: dict[str, Any], context: dict[str, Any]) -> Any:
        try:
            td, needed = self._gpus_needed(params["taskDefinition"], params.get("overrides"))
        except Exception:
            return None  # let moto produce its own error
        refused = start_task_network_refusal(str(getattr(td, "network_mode", "") or "bridge"), params)
        if refused:
            return hook_error("ecs", "InvalidParameterException", refused)
        cis = list(params.get("containerInstances") or [])
        placed: list[str] = []
        failures: list[dict[str, str]] = []
        rid = next(self._reservation_ids)
        with self._lock:
            known = self._backend.container_instances.get(self.local.cluster_name, {})
            for ref in cis:
                node = self._node_or_none(ref)
                if node is None:
                    if str(ref).rsplit("/", 1)[-1] in known:
                        placed.append(ref)  # moto's own instance: moto answers
                    else:
                        failures.append({"arn": ref, "reason": MISSING})
                    continue
                reason = placement_failure(node, needed, self._ci_status(node))
                if reason:
                    failures.append({"arn": node.container_instance_arn, "reason": reason})
                    continue
                node.reservations[rid] = node.reservations.get(rid, []) + node.free_gpu_ids[:needed]
                placed.append(ref)
            context["local_mode_reservation"] = rid
            context["local_mode_failures"] = failures
            self.counters["start_failures"] += len(failures)
        for f in failures:
            n = self._node_or_none(f["arn"])
            if n is not None:
                self._log("placement", f"StartTask refused: {f['reason']} ({len(n.free_gpu_ids)} "
                          f"free, agent {'up' if n.agent_connected else 'down'})", n.name)
        if not placed:
            context["local_mode_short_circuit"] = True
            return hook_answer("ecs", {"tasks": [], "failures": failures})
        if failures:  # start on the instances that fit, as ECS does
            request = context.get("local_mode_request") or {}
            body = json.loads(request.get("body") or b"{}")
            body["containerInstances"] = placed
            request["body"] = json.dumps(body).encode()
        return None

    def _release_reservation(self, rid: int | None) -> None:
        if rid is None:
            return
        with self._lock:
            for node in self.nodes.values():
                node.reservations.pop(rid, None)

    def _after_start_task(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        rid = context.get("local_mode_reservation")
        failures = context.get("local_mode_failures") or []
        if status >= 300:
            self._release_reservation(rid)
            return
        tags = {t["key"]: t["value"] for t in params.get("tags") or []}
        now = self.now()
        new: list[Task] = []
        with self._lock:
            for task_desc in parsed.get("tasks") or []:
                node = self._node_or_none(task_desc.get("containerInstanceArn", ""))
                if node is None or task_desc["taskArn"] in self.tasks:
                    continue
                gpu_ids = (node.reservations.get(rid) if rid is not None else None) or []
                td, needed = self._gpus_needed(params["taskDefinition"], params.get("overrides"))
                gpu_ids, rest = gpu_ids[:needed], gpu_ids[needed:]
                if rid in node.reservations:
                    if rest:
                        node.reservations[rid] = rest
                    else:
                        node.reservations.pop(rid)
                node.allocations[task_desc["taskArn"]] = gpu_ids
                group = task_desc.get("group") or f"family:{td.family}"
                reset = group.startswith(C.GPU_RESET_GROUP) or td.family == C.DEFAULT_GPU_RESET_FAMILY
                hc = not reset and (group.startswith(C.HEALTH_CHECK_GROUP)
                                    or td.family == C.DEFAULT_HEALTH_CHECK_FAMILY)
                task = Task(
                    arn=task_desc["taskArn"],
                    node=node.name,
                    task_definition_arn=td.arn,
                    family=td.family,
                    group=group,
                    started_by=task_desc.get("startedBy") or "",
                    overrides=params.get("overrides") or {"containerOverrides": []},
                    tags=tags,
                    gpu_ids=gpu_ids,
                    containers=[
                        {
                            "containerArn": (
                                f"arn:aws:ecs:{self.local.region}:{self.local.account_id}:"
                                f"container/{self.local.cluster_name}/"
                                f"{task_desc['taskArn'].rsplit('/', 1)[-1]}/{secrets.token_hex(8)}"
                            ),
                            "lastStatus": "PENDING",
                            "name": c.get("name", ""),
                            "image": c.get("image", ""),
                            "taskArn": task_desc["taskArn"],
                            "networkInterfaces": [],
                            "cpu": str(c.get("cpu", 0)),
                            "memory": str(c.get("memory", 0)),
                            "gpuIds": gpu_ids if i == 0 else [],
                        }
                        for i, c in enumerate(td.container_definitions)
                    ],
                    created_at=now,
                    updated_at=now,
                    memory=str(sum(int(c.get("memory", 0) or 0) for c in td.container_definitions)),
                    health_check=hc or reset,
                    gpu_reset=reset,
                    validation=group.startswith(C.GPU_VALIDATION_GROUP),
                    # moto's interface, as the task state change event names it ("eni")
                    attachments=[{**a, "type": "eni"} for a in task_desc.get("attachments") or []],
                )
                self.tasks[task.arn] = task
                self.placements.append(Placement(now, node.name, task.started_by, task.arn, node.health,
                                                 not task.health_check,
                                                 "" if task.health_check else node.latent or ""))
                new.append(task)
                self.counters["tasks_started"] += 1
                if hc:
                    self.counters["health_checks_started"] += 1
                if reset:
                    self.counters["gpu_resets_started"] += 1
                    self.repairs.record(node, "gpu_reset", "StartTask of the GPU reset task")
                self._sync_moto(task)
            self._release_reservation(rid)
        if failures and not context.get("local_mode_short_circuit"):
            parsed.setdefault("failures", []).extend(failures)
        for task in new:
            self._log("task", f"{task.label} placed ({len(task.gpu_ids)} GPUs)", task.node)
            self._schedule_placement(task, now)

    def _after_stop_task(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        if status >= 300:
            return
        arn = (parsed.get("task") or {}).get("taskArn") or params.get("task", "")
        reason = params.get("reason") or "Task stopped by user"
        with self._lock:
            task = self.tasks.get(arn) or next(
                (t for a, t in self.tasks.items() if a.endswith("/" + arn)), None
            )
            if task is None:
                return
            self._moto_stopped.add(task.arn)
            self.counters["stop_requests"] += 1
            requested = self._request_stop(task, reason)
            self._sync_moto(task)
            self._patch_task_response(task, parsed.get("task"))
        if requested:
            self._log("stop", f"StopTask {task.label}: {reason}", task.node)

    def _patch_task_response(self, task: Task, resp: dict[str, Any] | None) -> None:
        if resp is not None:
            resp["lastStatus"] = task.last_status
            resp["desiredStatus"] = task.desired_status
            if task.stop_code:
                resp["stopCode"] = task.stop_code

    def _answered_nodes(self, status: int, parsed: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Node]]:
        """A successful answer's container instances that are simulated nodes, with their node."""
        if status >= 300:
            return
        for ci in parsed.get("containerInstances") or []:
            node = self._node_or_none(ci.get("containerInstanceArn", ""))
            if node is not None:
                yield ci, node

    def _reboot_instances(self, params: dict[str, Any], why: str) -> None:
        """Reboot the simulated nodes among the request's ``InstanceIds``."""
        for iid in params.get("InstanceIds") or []:
            node = self._node_or_none(iid)
            if node is not None:
                self._reboot(node, why)

    def _after_describe_cis(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        for ci, node in self._answered_nodes(status, parsed):
            with self._lock:
                ci["agentConnected"] = node.agent_connected
                ci["ec2InstanceId"] = node.instance_id
                ci["version"] = node.version
                ci["versionInfo"] = {**(ci.get("versionInfo") or {}), "agentVersion": node.agent_version}
                if node.agent_update_status:
                    ci["agentUpdateStatus"] = node.agent_update_status
                for key, ids in (
                    ("registeredResources", node.gpu_ids),
                    ("remainingResources", node.free_gpu_ids),
                ):
                    res = [r for r in ci.get(key) or [] if r.get("name") != "GPU"]
                    res.append(ev.gpu_resource(ids))
                    ci[key] = res
                ci["runningTasksCount"] = len(
                    [t for t in self.tasks.values() if t.node == node.name and not t.done]
                )

    def _after_update_ci_state(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        for ci, node in self._answered_nodes(status, parsed):
            if ci.get("status") == "DRAINING" and node.status != "DRAINING":
                self.repairs.record(node, "quarantine", "UpdateContainerInstancesState DRAINING")
            node.status = str(ci.get("status") or node.status)  # moto's record answers the API
            self._log("node", f"container instance -> {ci.get('status')}", node.name)
            self.schedule(self.now(), partial(self._ci_events, node), "ci state")

    def _after_reboot_instances(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        if status < 300:
            self._reboot_instances(params, "EC2 RebootInstances")

    def _after_send_command(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        document = params.get("DocumentName")
        if status >= 300:
            return
        if document == "AWS-RunShellScript":
            commands = " ; ".join((params.get("Parameters") or {}).get("commands") or [])
            if not any(word in commands for word in REBOOT_WORDS):
                return
        elif document != (os.environ.get(C.ENV_REBOOT_DOCUMENT) or C.DEFAULT_REBOOT_DOCUMENT_NAME):
            return  # the stack's reboot-only document: every send is a reboot
        self._reboot_instances(params, f"SSM {document}")

    # ================================================================ Auto Scaling
    def put_in_auto_scaling_group(self, nodes: list[str], group: str = "gpu-nodes") -> str:
        """Create an Auto Scaling group (tagged with the cluster tag) holding ``nodes``."""
        asg, ec2 = self.local.client("autoscaling"), self.local.client("ec2")
        if group not in set(self.auto_scaling_groups.values()):
            template = ec2.create_launch_template(
                LaunchTemplateName=f"{group}-lt",
                LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "p5.48xlarge"})
            asg.create_auto_scaling_group(
                AutoScalingGroupName=group, MinSize=0, MaxSize=64, DesiredCapacity=0,
                LaunchTemplate={"LaunchTemplateId": template["LaunchTemplate"]["LaunchTemplateId"]},
                AvailabilityZones=[f"{self.local.region}a"],
                Tags=[{"Key": self.node_tag_key, "Value": self.local.cluster_name, "PropagateAtLaunch": True,
                       "ResourceId": group, "ResourceType": "auto-scaling-group"}])
        ids = [self.node(n).instance_id for n in nodes]
        asg.attach_instances(AutoScalingGroupName=group, InstanceIds=ids)
        for n in nodes:
            self.auto_scaling_groups[self.node(n).name] = group
        return group

    def _after_terminate_in_asg(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        if status >= 300:
            return
        node = self._node_or_none(params.get("InstanceId", ""))
        if node is None:
            return
        with self._lock:
            self.counters["terminations"] += 1
            self.repairs.record(node, "replace", "TerminateInstanceInAutoScalingGroup")
        self._log("node", "terminated in its Auto Scaling group (desired capacity kept)", node.name)
        host = node.instance_id

        def gone() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for task in self.running_tasks(node.name):
                out += self._finish(task, exit_code=137, stop_code="EssentialContainerExited",
                                    reason=f"Host EC2 (instance {host}) terminated", why="host terminated")
            node.agent_connected = False
            node.status = "INACTIVE"
            with contextlib.suppress(Exception):
                self.local.client("ecs").deregister_container_instance(
                    cluster=self.local.cluster_name, containerInstance=node.container_instance_arn,
                    force=True)
            return [*out, self._ci_event(node)]

        def replacement() -> list[dict[str, Any]]:
            count = sum(1 for name in self.nodes if name.startswith(f"{node.name}-r")) + 1
            # The group launched an EC2 instance to keep its desired capacity (moto does at
            # the termination): the new node registers on it, a member of the same group.
            group = self.auto_scaling_groups[node.name]
            known = {n.instance_id for n in self.nodes.values()}
            [described] = self.local.client("autoscaling").describe_auto_scaling_groups(
                AutoScalingGroupNames=[group])["AutoScalingGroups"]
            launched = [i["InstanceId"] for i in described["Instances"] if i["InstanceId"] not in known]
            new = self.add_node(f"{node.name}-r{count}", gpus=len(node.gpu_ids),
                                instance_id=launched[0] if launched else None)
            self.auto_scaling_groups[new.name] = group
            self._log("node", f"replacement for {node.name} launched by the Auto Scaling group", new.name)
            return []

        self.schedule(self.now() + 5, gone, "terminated")
        self.schedule(self.now() + self.replacement_seconds, replacement, "asg replacement")
