"""The one simulation layer every local app, campaign, bench and test runs on.

Both worlds wire the recovery functions from :mod:`~local_mode.sim.deployment`: the
deployed rules, schedule, queues and event sources, timeouts and Lambda's async retry policy,
as data (checked against the synthesized template in tests/infra).

The moto-backed world (demo, playground, scenarios, crash campaigns):

* :mod:`~local_mode.sim.clock` — ``SimClock``: simulated time, moved only by the driver;
  ``TimedActions``: the discrete-event core (actions due at simulated times); both worlds
  drive theirs; ``DEFAULT_START``, the simulated start every simulation shares.
* :mod:`~local_mode.sim.ecs_model` — the ECS records both worlds share: ``Node`` (a GPU
  host and its container instance), ``Task``, ``TaskDefinition``, ``Plan``, ``TimelineEntry``,
  their state transitions and their ECS descriptions.
* :mod:`~local_mode.sim.ecs_data_plane` — ``DataPlane``: the task lifecycle and reboots both
  worlds run (PENDING, RUNNING, plans, DCGM verdicts, GPU resets, STOPPED, the events), with
  a few hooks each world fills in (clock and driver, event shapes, its control plane).
* :mod:`~local_mode.sim.ecs` — ``SimulatedEcs``: the ECS data plane (GPU nodes, agents,
  tasks, reboots, DCGM verdicts) behind moto's control plane; its parts are
  ``ecs_core`` (state, nodes, driver), ``ecs_tasks`` (the lifecycle's moto hooks) and
  ``ecs_faults`` (GPU faults, XIDs).
* :mod:`~local_mode.sim.bus` — ``EventBus``, the one bus of both worlds: EventBridge rules
  (moto's matcher) and schedules, at-least-once copies, Lambda's async retry policy and dead
  letters, SQS event-source semantics; delivery synchronous in process here
  (``InProcessEventSource``: a queue's event source), timed on the engine in the scale world.
* :mod:`~local_mode.sim.sqs_model` — ``MessageQueue``, the one SQS queue model of both
  worlds: messages, delay seconds, visibility, receive counts, redrive to a dead-letter queue
  (on the receive that would exceed maxReceiveCount, as SQS does).
* :mod:`~local_mode.sim.wiring` — the recovery Lambdas on the bus as infra deploys them, for
  both worlds (``wire_deployment``; each world a ``FunctionHost``: where a function runs).
* :mod:`~local_mode.sim.dynamo` — ``MemoryDynamo``: the in-memory DynamoDB (either world's
  storage backend when moto's is too slow).
* :mod:`~local_mode.sim.answers` — ``DocumentedAnswers``: what AWS documents and moto never
  answers (GetLogEvents pages and late lines, from :mod:`~local_mode.sim.log_pages`, which the
  scale world's CloudWatch Logs pages too; a transaction cancelled for throttling, unprocessed
  keys, ECS ``failures``): the shapes the crash campaigns break calls in.
* :mod:`~local_mode.sim.api_errors`, :mod:`~local_mode.sim.broken_calls` — AWS errors injected
  in the emulated account; the crash campaigns' broken call.

The timed world of the scale simulator (``make bench BENCH=scale``; ``ScaleWorld`` in
``local_mode.scale_recovery``, wired by ``sim.wiring``), where invocations interleave at AWS calls:

* :mod:`~local_mode.sim.engine` — ``Simulation``: processes (one per Lambda invocation) on
  the clock's ``TimedActions``, ``LambdaTimeout``.
* :mod:`~local_mode.sim.aws_calls` — ``Account``, ``SimClient``: call latency, account-wide
  rate limits, botocore's standard retries and retry quota, call statistics.
* :mod:`~local_mode.sim.lambdas` — ``LambdaService``: concurrency, containers, timeouts,
  the bus's async retry policy and dead letters; ``EngineTiming``: the ``EventBus``'s
  delivery on the engine (each copy after its own random delay, schedules).
* :mod:`~local_mode.sim.sqs` — ``SqsQueue`` (the shared ``MessageQueue`` with its SQS
  client), ``SqsEventSource``: Lambda's poller on the engine (batch size, batching window,
  maximum concurrency).
* :mod:`~local_mode.sim.ecs_cluster` — ``EcsCluster``, ``EcsClient``: the ECS control-plane
  API over :mod:`~local_mode.sim.ecs_cluster_data_plane` (the cluster's state and the
  ``DataPlane`` hooks of this world), on the records of :mod:`~local_mode.sim.ecs_model`.
* :mod:`~local_mode.sim.log_store` — ``LogStore``: CloudWatch Logs lines (the verdicts).
* :mod:`~local_mode.sim.aws_stand_ins` — EC2, SSM, CloudWatch Logs (paged as the service
  pages, :mod:`~local_mode.sim.log_pages`) and SNS clients.

Both worlds build their events with ``local_mode.events`` (and take ``ACCOUNT_ID`` /
``REGION`` from it). ``local_mode.world.build_world`` assembles either world
(``backend="moto"`` or ``"scale"``); nothing else constructs them.
"""
