"""A task's network in the ``awsvpc`` mode: what StartTask must be given again. Pure.

ECS requires ``networkConfiguration`` for a task definition in the ``awsvpc`` network mode
("The VPC subnet and security group configuration for tasks that receive their own elastic
network interface by using the awsvpc networking mode", StartTask API reference; without it:
InvalidParameterException "Network Configuration must be provided when networkMode 'awsvpc'
is specified.") and refuses it for the other modes ("Network Configuration is not valid for
the given networkMode of this task definition."). ``subnets``: up to 16, ``securityGroups``:
up to 5 (none: the VPC's default group), all of one VPC; ``assignPublicIp`` ENABLED is
Fargate's only ("Assign public IP is not supported for this launch type" on EC2), so this
stack, which runs on EC2 container instances, always gives DISABLED.

What a restart gives, and where it comes from (stored per job, a rank keeps only its subnet):

* a queue job: the job spec's ``network`` (subnets, security groups), checked at submission
  against the task definition's network mode;
* a job registered from its tasks (tags or the registration convention): its security groups
  from ``gpu-recovery:security-groups`` (tag) / ``GPU_RECOVERY_SECURITY_GROUPS`` (environment),
  space-separated (an ECS tag value allows no comma); its subnets from
  ``gpu-recovery:subnets`` / ``GPU_RECOVERY_SUBNETS`` if given, and each rank's own: the
  subnet of its elastic network interface (``attachments[].details`` ``subnetId`` of the
  task's event and of DescribeTasks). ECS tells no task's security groups (the attachment
  carries the subnet, the interface id, the addresses): a task in ``awsvpc`` mode registered
  without them is refused loudly rather than restarted into the VPC's default group.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MAX_SUBNETS = 16
MAX_SECURITY_GROUPS = 5
SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8}(?:[0-9a-f]{9})?$")
SECURITY_GROUP_ID = re.compile(r"^sg-[0-9a-f]{8}(?:[0-9a-f]{9})?$")
# The attachment of a task's elastic network interface: "eni" in the task state change
# event, "ElasticNetworkInterface" in DescribeTasks.
ENI_ATTACHMENT_TYPES = ("eni", "ElasticNetworkInterface")


class NetworkError(ValueError):
    """A network configuration ECS would refuse (what to fix)."""


def eni_subnet(task: Mapping[str, Any]) -> str:
    """The subnet of the task's elastic network interface ("" when it has none: a task not
    in the ``awsvpc`` mode)."""
    for attachment in task.get("attachments") or []:
        if not isinstance(attachment, Mapping) or attachment.get("type") not in ENI_ATTACHMENT_TYPES:
            continue
        for detail in attachment.get("details") or []:
            if isinstance(detail, Mapping) and detail.get("name") == "subnetId" and detail.get("value"):
                return str(detail["value"])
    return ""


def id_list(value: str | None) -> list[str]:
    """A tag's or an environment variable's ids: separated by spaces (or commas, in the
    environment)."""
    return [part for part in re.split(r"[\s,]+", value or "") if part]


def awsvpc_configuration(subnets: Iterable[str], security_groups: Iterable[str]) -> dict[str, Any]:
    """StartTask's ``awsvpcConfiguration``; raises :class:`NetworkError` for what ECS refuses."""
    subnets = list(dict.fromkeys(subnets))
    groups = list(dict.fromkeys(security_groups))
    if not subnets:
        raise NetworkError("at least one subnet is needed")
    if len(subnets) > MAX_SUBNETS:
        raise NetworkError(f"{len(subnets)} subnets: ECS takes at most {MAX_SUBNETS}")
    if len(groups) > MAX_SECURITY_GROUPS:
        raise NetworkError(f"{len(groups)} security groups: ECS takes at most {MAX_SECURITY_GROUPS}")
    bad = [s for s in subnets if not SUBNET_ID.match(s)]
    bad += [g for g in groups if not SECURITY_GROUP_ID.match(g)]
    if bad:
        raise NetworkError(f"not a subnet or security group id: {', '.join(bad)}")
    return {"subnets": subnets, "securityGroups": groups, "assignPublicIp": "DISABLED"}


def restart_network(job_network: Mapping[str, Any], rank_subnets: Iterable[str]) -> dict[str, Any] | None:
    """StartTask's ``networkConfiguration`` for a restart of ranks whose own subnets are
    ``rank_subnets``, given the job's ``awsvpcConfiguration`` (None: the job's tasks are not
    in the ``awsvpc`` mode). The ranks' own subnets come first (each node's availability
    zone has its subnet there; ECS takes the one in the instance's zone)."""
    own = [s for s in rank_subnets if s]
    if not job_network and not own:
        return None
    subnets = list(dict.fromkeys([*own, *(job_network.get("subnets") or [])]))[:MAX_SUBNETS]
    return {"awsvpcConfiguration": {
        "subnets": subnets,
        "securityGroups": list(job_network.get("securityGroups") or []),
        "assignPublicIp": str(job_network.get("assignPublicIp") or "DISABLED"),
    }}
