"""The one simulation layer every local app, campaign, bench and test runs on.

* :mod:`~local_mode.sim.clock` — ``SimClock``: simulated time, moved only by the driver.
* :mod:`~local_mode.sim.ecs` — ``SimulatedEcs``: the ECS data plane (GPU nodes, agents,
  tasks, reboots, DCGM verdicts) behind moto's control plane; its parts are
  ``ecs_model`` (records), ``ecs_core`` (state, nodes, driver), ``ecs_tasks`` (task
  lifecycle, reboots) and ``ecs_faults`` (GPU faults, XIDs).
* :mod:`~local_mode.sim.bus` — ``LocalEventBus``: EventBridge rules and schedules, SQS
  event sources, Lambda's async retries and dead letters, in simulated time.
* :mod:`~local_mode.sim.wiring` — the recovery Lambdas on the bus as infra deploys them.

``local_mode.world.build_world`` assembles them; nothing else constructs them.
"""
