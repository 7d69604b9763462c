"""Checks of the cluster and its GPU nodes: the cluster, the GPU instances, the reboot tag,
SSM reachability of ECS Anywhere hosts, the health-check task definition and its image."""

from __future__ import annotations

from dataclasses import dataclass

from botocore.exceptions import ClientError

from cli.doctor.findings import FAIL, PASS, REDEPLOY, SKIP, WARN, Finding, chunks, error_text, listing
from cli.doctor.outputs import Account, aws_client_in


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



class NodeChecks(Account):
    _nodes: list[GpuNode] | None = None  # read once, by the first check that needs them
    _cluster_ok = False  # the cluster exists and is ACTIVE (checks of its nodes need it)

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
            for chunk in chunks(arns, 100):
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
        findings = [Finding("GPU instances", PASS, f"{len(gpu)} registered: {listing(described)}"
                            + (f"; {others} without GPUs" if others else ""))]
        disconnected = [n.container_instance_id for n in gpu if not n.agent_connected]
        if disconnected:
            findings.append(Finding("GPU instances", WARN,
                                    f"ECS agent disconnected on {listing(disconnected)}",
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
        for chunk in chunks(ec2_ids, 200):
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
                        f"may not reboot them: {listing([n.host_id for n in untagged])}",
                        "; ".join(fixes))]

    def check_ssm(self) -> list[Finding]:
        if not self._cluster_ok:
            return [Finding("SSM reachability", SKIP, "cluster not found")]
        hosts = [n.host_id for n in self.gpu_nodes() if n.anywhere]
        if not hosts:
            return [Finding("SSM reachability", PASS, "no ECS Anywhere hosts (EC2 hosts reboot through EC2)")]
        status: dict[str, str] = {}
        ssm = self.client("ssm")
        for chunk in chunks(hosts, 50):
            pages = ssm.get_paginator("describe_instance_information").paginate(
                Filters=[{"Key": "InstanceIds", "Values": list(chunk)}])
            for page in pages:
                for info in page.get("InstanceInformationList", []):
                    status[info["InstanceId"]] = info.get("PingStatus", "?")
        offline = [f"{h} ({status.get(h, 'not registered with SSM')})" for h in hosts
                   if status.get(h) != "Online"]
        if offline:
            return [Finding("SSM reachability", FAIL,
                            f"{len(offline)} ECS Anywhere hosts cannot be rebooted: {listing(offline)}",
                            "check the SSM agent on each host (systemctl status amazon-ssm-agent) and its "
                            "route to ssm.<region>.amazonaws.com")]
        return [Finding("SSM reachability", PASS, f"all {len(hosts)} ECS Anywhere hosts Online in SSM")]

    # ------------------------------------------------------------------ health check
    def check_health_check(self) -> list[Finding]:
        reference = self.out("HealthCheckTaskDefinitionArn")
        try:
            task_def = self.client("ecs").describe_task_definition(taskDefinition=reference)["taskDefinition"]
        except ClientError as error:
            return [Finding("health check", FAIL, f"task definition {reference}: {error_text(error)}",
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
                                    f"checked: {listing(too_small)}",
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
        ecr = aws_client_in(self.session, "ecr", parts[3])
        try:
            ecr.describe_images(registryId=parts[0], repositoryName=repository, imageIds=[image_id])
        except ClientError as error:
            return [Finding("health check", FAIL, f"image {image}: {error_text(error)}",
                            "push the DCGM image to that repository, or deploy with "
                            "-c health_check_image=...")]
        return []
