"""Node heartbeats, one module per concern (``gpu_recovery.runtime`` builds the service):

* ``service`` — ``HeartbeatService``: task reports, GPU telemetry and the stale sweep
* ``escalation`` — the sweep's ranks NODE_LOST too long: the recovery loop's check or node decision
* ``ports`` — what the service needs from the rest of the stack (ECS, SNS, recovery, metrics)
* ``results`` — what it answers (a report's or a sweep's outcome, a replayed report)
* ``tokens`` — the node report tokens the node API's authorizer verifies
"""
