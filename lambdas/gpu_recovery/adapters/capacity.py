"""A Capacity Reservation's instances (EC2 DescribeInstances filtered by
``capacity-reservation-id``): a Capacity Block's expiration warning names the reservation only
(docs/aws-notices.md: one call per 1,000 instances of the block, per warning)."""

from __future__ import annotations

from typing import Any

#: the states an instance of the block can still run work in
LIVE_STATES = ("pending", "running")


class CapacityReservations:
    def __init__(self, ec2_client: Any) -> None:
        self._ec2 = ec2_client

    def instances_in(self, reservation_id: str) -> list[str]:
        """The ids of the reservation's pending and running instances."""
        found: list[str] = []
        paginator = self._ec2.get_paginator("describe_instances")
        pages = paginator.paginate(Filters=[{"Name": "capacity-reservation-id", "Values": [reservation_id]},
                                            {"Name": "instance-state-name", "Values": list(LIVE_STATES)}],
                                   PaginationConfig={"PageSize": 1000})
        for page in pages:
            for reservation in page.get("Reservations", []):
                instances = reservation.get("Instances", [])
                found.extend(str(i["InstanceId"]) for i in instances if i.get("InstanceId"))
        return sorted(set(found))
