"""``make playground``: a local GPU cluster to poke at, behind the local REST API.

One process runs what ``make demo`` runs in scripted, simulated time, driven instead by a
real-time clock (optionally accelerated) while the API serves requests:

* the embedded AWS emulator (:class:`local_mode.emulator.LocalAws`), also served over HTTP
  on its own port so ``gpu-recovery-admin quota|breaker|list-tokens`` reach its DynamoDB
  tables with ``AWS_ENDPOINT_URL`` (boto3's ordinary endpoint override);
* a simulated ECS cluster (:class:`local_mode.sim.ecs.SimulatedEcs`) of ``--nodes`` GPU
  nodes (default 4 x 8 GPUs) whose AWS-shaped events reach the real handlers through the
  local event bus, every event delivered twice (EventBridge is at-least-once);
* every task definition ``examples/*.yaml`` and ``cli/README.md`` name (``llama-train:3`` is
  registered as revisions 1..3), with an ``awslogs`` log configuration: the simulated
  training programs write to CloudWatch Logs, where ``gpujobs logs`` reads;
* the user running it, and ``admin``, are admin roles of the jobs API (every quota, every
  job, the reserved priorities); the CLI acts as ``$USER``;
* the schedules (recovery sweep, heartbeat sweep, queue scheduler: every minute) and a
  simulated node agent per node (``/v1/report_tasks`` over HTTP every 30 s, XIDs through
  ``/v1/report_gpu``);
* the gang queue and its worker, as ``make demo`` wires them: a gang of more than 16 ranks
  is stopped and started in batches through it, in simulated time (the console shows each
  batch the worker receives);
* a training program in every rank (:mod:`local_mode.training_programs`): it logs its steps, saves a
  checkpoint every 2 simulated minutes, restarts from the last checkpoint, and its rank 0
  polls the suspend channel with the real ``training_client`` and calls ``go_suspend()``;
* the local API (:mod:`local_mode.server`) plus **local-only** routes, never deployed:
  ``GET /local/nodes`` (the cluster) and ``POST /local/faults`` (inject a fault), used by
  ``gpu-recovery-admin inject-fault``.

The console shows the cluster's timeline, every job's state changes and the text of each
e-mail the stack sends (SNS). Run it::

    make playground                       # 4 nodes x 8 GPUs, real time, API on :8080
    make playground PLAYGROUND_ARGS="--nodes 8 --speed 10"
    python -m local_mode.playground --port 0 --aws-port 0 --speed 40 --run-minutes 2

Threads: the driver thread advances simulated time (events, schedules, node agents,
training programs); API requests run on the HTTP server's threads. Jobs-API requests and
fault injection take the world lock the driver holds while it steps, so the handlers of
the recovery loop, the queue and the API never run at the same time (the node agents'
and training programs' own HTTP calls are made by the driver and need no such lock).

Modules: ``driver`` (``Playground``: builds the world, drives simulated time), ``console``
(the console and what it shows), ``local_routes`` (``/local/...``), ``fault_injection``
(``POST /local/faults``), ``config`` (the options, the task definitions registered),
``command_line`` (``main``).
"""

from local_mode.playground.command_line import main
from local_mode.playground.config import PlaygroundConfig, PlaygroundError, example_task_definitions
from local_mode.playground.console import Console
from local_mode.playground.driver import Playground

__all__ = ["Console", "Playground", "PlaygroundConfig", "PlaygroundError", "example_task_definitions", "main"]
