"""Local mode: the recovery Lambdas end to end on a laptop, in simulated time.

* :mod:`local_mode.emulator` — ``LocalAws``: moto with the stack's tables, topic,
  cluster and health-check task definition; handler environment; API hooks.
* :mod:`local_mode.sim` — the simulation layer: ``SimClock``; ``SimulatedEcs`` (GPU nodes,
  agents, tasks, reboots and faults, driven in simulated time); ``EventBus``
  (EventBridge rules with the deployed patterns, at-least-once delivery, schedules, SQS
  event sources); ``wire_recovery_handlers`` (the Lambdas on the bus as infra deploys them).
* :mod:`local_mode.world` — ``build_world``: the three above set up together, with the
  recovery Lambdas wired (the demo, the playground, the scenarios, the campaigns, the
  benches and the tests all enter it), torn down with the handlers' services.
* :mod:`local_mode.events` — AWS-documented ECS event builders.
* :mod:`local_mode.sim.api_errors` — ``ApiFaults``: transient / persistent AWS API errors;
  :mod:`local_mode.sim.broken_calls` — ``CallFaults``: one call of a flow broken once.
* :mod:`local_mode.playground` — ``make playground``: all of the above driven from a
  real-time clock behind the local API (:mod:`local_mode.server`), with simulated training
  programs (:mod:`local_mode.training_programs`) and faults on demand.

Typical use::

    with build_world(max_recovery_attempts=3) as world:
        world.ecs.add_node("node-a")
        ...
        world.ecs.run_for(3600)
"""
