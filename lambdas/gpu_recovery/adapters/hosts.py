"""A node's private address (rank 0's, for MASTER_ADDR): EC2 DescribeInstances for ``i-``
instances, SSM DescribeInstanceInformation for ECS Anywhere (``mi-``) hosts; cached."""

from __future__ import annotations

import time
from typing import Any


class HostAddresses:
    """Private IP by instance id, cached ``ttl_seconds`` (an address found only: an empty
    answer is asked again next time). Errors (throttling, a terminated instance) are raised:
    the launcher skips the job for this tick."""

    def __init__(self, ec2_client: Any, ssm_client: Any | None = None, ttl_seconds: float = 600) -> None:
        self._ec2 = ec2_client
        self._ssm = ssm_client
        self._ttl = ttl_seconds
        self._cache: dict[str, tuple[float, str]] = {}

    def address(self, instance_id: str) -> str:
        """The instance's private IP, or "" when AWS knows none (or no SSM client for mi-)."""
        hit = self._cache.get(instance_id)
        if hit and time.monotonic() - hit[0] < self._ttl:
            return hit[1]
        found = self._lookup(instance_id)
        if found:
            self._cache[instance_id] = (time.monotonic(), found)
        return found

    def _lookup(self, instance_id: str) -> str:
        if not instance_id:
            return ""
        if instance_id.startswith("mi-"):
            if self._ssm is None:
                return ""
            response = self._ssm.describe_instance_information(
                Filters=[{"Key": "InstanceIds", "Values": [instance_id]}]
            )
            infos = response.get("InstanceInformationList") or []
            return str(infos[0].get("IPAddress", "")) if infos else ""
        response = self._ec2.describe_instances(InstanceIds=[instance_id])
        for reservation in response.get("Reservations", []):
            for inst in reservation.get("Instances", []):
                if inst.get("PrivateIpAddress"):
                    return str(inst["PrivateIpAddress"])
        return ""
