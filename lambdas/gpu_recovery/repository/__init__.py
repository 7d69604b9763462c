"""The only DynamoDB user: one module per service's records, over shared plumbing.

* ``base`` — value mapping, :class:`Update`, transactions, batched reads.
* ``recovery`` — jobs, ranks and container instances of the recovery loop (intents).

Services receive repositories from ``gpu_recovery.runtime`` and call their intents;
no condition expression is written outside this package.
"""

from gpu_recovery.repository.base import (
    MAX_HISTORY,
    DynamoGateway,
    Update,
    from_ddb,
    is_condition_failure,
    state_condition,
    to_ddb,
)
from gpu_recovery.repository.recovery import JobFailure, JobVerdict, NodeDecision, RankStop, Repository

__all__ = [
    "MAX_HISTORY",
    "DynamoGateway",
    "JobFailure",
    "JobVerdict",
    "NodeDecision",
    "RankStop",
    "Repository",
    "Update",
    "from_ddb",
    "is_condition_failure",
    "state_condition",
    "to_ddb",
]
