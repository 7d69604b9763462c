"""``make playground``: a local GPU cluster to poke at, behind the local REST API.

One process runs what ``make demo`` runs in scripted, simulated time, driven instead by a
real-time clock (optionally accelerated) while the API serves requests:

* the embedded AWS emulator (:class:`local_mode.emulator.LocalAws`), also served over HTTP
  on its own port so ``gpu-recovery-admin quota|breaker|list-tokens`` reach its DynamoDB
  tables with ``AWS_ENDPOINT_URL`` (boto3's ordinary endpoint override);
* a simulated ECS cluster (:class:`local_mode.ecs_sim.SimulatedEcs`) of ``--nodes`` GPU
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
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import io
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from gpu_recovery import clock as gr_clock
from gpu_recovery import constants as C
from local_mode.server import ApiResponse, LocalApi, LocalApiServer
from local_mode.training_programs import CHECKPOINT_EVERY_STEPS, PROGRAM_TICK_SECONDS, TrainingPrograms

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
# Task definitions the CLI's documentation submits besides the examples' (cli/README.md).
DOCUMENTED_TASK_DEFINITIONS = {"bert-train": 7}
LOCAL_PREFIX = "/local"
SCHEDULE_SECONDS = 60  # the deployed rate(1 minute) schedules
AGENT_INTERVAL_SECONDS = 30
DRIVER_TICK_SECONDS = 0.05  # wall seconds between two advances of the simulated clock
# The driver holds the world lock at most this long at a time (API requests wait for it),
# advancing at most this much simulated time per run (events at one time all run).
MAX_HOLD_SECONDS = 0.1
SIM_CHUNK_SECONDS = 1.0
# Behind its target by more than this many wall seconds' worth, the simulation slows down
# (the target is moved back) instead of racing to catch up.
MAX_LAG_SECONDS = 1.0
CONSOLE_EVERY_SECONDS = 0.25  # wall seconds between two looks at jobs and e-mails
# Rank 0 asks the suspend channel every JOB_CONTROL_POLL_SECONDS (deployed: 2). Each answer
# costs the emulator ~0.1 s of CPU, so an accelerated playground asks less often in
# simulated time: every speed/2 simulated seconds (2 at up to 4x, at most 30: a grace of
# 60 s, the default, is still honoured).
CONTROL_POLL_SECONDS = (2, 30)
FAULT_KINDS = ("xid", "dead_gpu", "flap", "app_error", "lost_node")
# What a health check finds after an XID, by the fault catalog's class of it: application
# errors leave the GPU healthy, XID 64 (row-remap failure) needs a new node, the rest are
# fixed by a reboot (``persistent`` in the request: they are not).
APPLICATION_XIDS = frozenset({13, 31, 43, 94})
REPLACE_XIDS = frozenset({64})
CUDA_ERRORS = {
    13: "an illegal instruction was encountered", 31: "an illegal memory access was encountered",
    43: "unspecified launch failure", 48: "uncorrectable ECC error encountered",
    64: "uncorrectable ECC error encountered", 79: "unspecified launch failure",
    94: "uncorrectable ECC error encountered",
}
TERMINAL = ("COMPLETE", "FAILED", "CANCELED", "USER_STOPPED")
MIN_REBOOT_SECONDS = 30  # SimulatedEcs: tasks killed 5 s, agent down 15 s after the request


class PlaygroundError(Exception):
    """A request the playground refuses: HTTP ``status``, the field at fault."""

    def __init__(self, message: str, *, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


# ------------------------------------------------------------------------------ settings
@dataclass
class PlaygroundConfig:
    nodes: int = 4
    gpus_per_node: int = 8
    speed: float = 1.0
    port: int = 8080
    aws_port: int = 8081
    run_minutes: float = 10.0
    reboot_seconds: float = 180.0
    dcgm_seconds: float = 120.0
    duplicate_delivery: bool = True
    verbose: bool = False
    examples_dir: Path = EXAMPLES_DIR

    def validate(self) -> PlaygroundConfig:
        checks = (
            ("nodes", 1 <= self.nodes <= 64, "1..64"),
            ("gpus", 1 <= self.gpus_per_node <= 16, "1..16"),
            ("speed", 0 < self.speed <= 1000, "above 0, at most 1000"),
            ("port", 0 <= self.port <= 65535, "0..65535"),
            ("aws_port", 0 <= self.aws_port <= 65535, "0..65535"),
            ("run_minutes", 0 < self.run_minutes <= 7 * 24 * 60, "above 0, at most a week"),
            # The simulated agent disconnects 15 s after the reboot request: a node back before
            # that would never be seen going down (the recovery would wait for it in vain).
            ("reboot_seconds", MIN_REBOOT_SECONDS <= self.reboot_seconds <= 3600,
             f"{MIN_REBOOT_SECONDS}..3600"),
            ("dcgm_seconds", 5 <= self.dcgm_seconds <= 3600, "5..3600"),
        )
        for option, ok, accepted in checks:
            if not ok:
                value = getattr(self, "gpus_per_node" if option == "gpus" else option)
                raise ValueError(f"--{option.replace('_', '-')}: {value:g} is not {accepted}")
        if self.port and self.port == self.aws_port:
            raise ValueError("--port and --aws-port must differ")
        return self

    @property
    def run_seconds(self) -> float:
        return self.run_minutes * 60


def example_task_definitions(examples_dir: Path) -> dict[str, int]:
    """family -> highest revision named by ``task_definition`` in ``examples_dir/*.yaml``
    (``family`` alone counts as revision 1; an ARN is read as its ``family:revision``)."""
    import yaml

    found: dict[str, int] = {}
    for path in sorted(examples_dir.glob("*.y*ml")):
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        ref = str((doc or {}).get("task_definition") or "") if isinstance(doc, dict) else ""
        ref = ref.rsplit("/", 1)[-1]
        if not ref:
            continue
        family, _, revision = ref.partition(":")
        found[family] = max(found.get(family, 0), int(revision) if revision.isdigit() else 1)
    return found


# ------------------------------------------------------------------------------ console
class Console:
    """Thread-safe lines on a stream; each line is written whole."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self.stream = stream
        self.quiet = quiet
        self._lock = threading.Lock()

    def print(self, *lines: str) -> None:
        if self.quiet:
            return
        stream = self.stream or sys.stdout
        with self._lock:
            for line in lines:
                stream.write(line + "\n")
            stream.flush()


class _StdoutWithoutEmf(io.TextIOBase):
    """sys.stdout while the playground runs: Powertools prints EMF metric lines there
    (CloudWatch Logs in Lambda) even with metrics disabled; they are dropped, every other
    line passes (each thread's partial line is held until its newline)."""

    def __init__(self, target: TextIO) -> None:
        self.target = target
        self._partial = threading.local()

    def write(self, text: str) -> int:
        pending = getattr(self._partial, "text", "") + text
        *lines, rest = pending.split("\n")
        self._partial.text = rest
        for line in lines:
            if not line.startswith('{"_aws"'):
                self.target.write(line + "\n")
        if lines:
            self.target.flush()
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return self.target.isatty()


def _hms(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M:%S")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------ the API
class PlaygroundApi(LocalApi):
    """The local API, plus the playground's local-only routes (never deployed):

    * ``GET /local`` — the playground: simulated time, speed, endpoints;
    * ``GET /local/nodes`` — every node: health, agent, GPUs free, what runs there;
    * ``POST /local/faults`` — inject a fault (``{"kind": "xid" | "dead_gpu" | "flap" |
      "app_error" | "lost_node", "node" | "job_id" [+ "rank"], ...}``), 202 with what
      was injected.

    Jobs-API requests run while the simulation is held (the world lock).
    """

    def __init__(self, playground: Playground) -> None:
        super().__init__()
        self.playground = playground

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes,
               source_ip: str = "127.0.0.1") -> ApiResponse:
        path = self._strip_stage(raw_path.partition("?")[0], self.stage)
        if path == LOCAL_PREFIX or path.startswith(LOCAL_PREFIX + "/"):
            return self.playground.local_route(method, path, body)
        if not (path.startswith("/v1/jobs") or path.startswith("/v1/quotas") or path == "/swagger"):
            return super().handle(method, raw_path, headers, body, source_ip)
        with self.playground.world():
            response = super().handle(method, raw_path, headers, body, source_ip)
        self.playground.api_called(method, path, headers, response)
        return response


def _answer(status: int, payload: Any) -> ApiResponse:
    return ApiResponse(status, {"Content-Type": "application/json"}, json.dumps(payload).encode())


# ------------------------------------------------------------------------------ the playground
class Playground:
    """See the module docstring. A context manager; :meth:`serve_forever` for ``main``."""

    def __init__(self, config: PlaygroundConfig | None = None, console: Console | None = None) -> None:
        self.config = (config or PlaygroundConfig()).validate()
        self.console = console or Console()
        self.local: Any = None
        self.bus: Any = None
        self.sim: Any = None
        self.agents: Any = None
        self.programs: TrainingPrograms | None = None
        self.server: LocalApiServer | None = None
        self.aws_server: Any = None
        self.aws_url = ""
        self.task_definitions: dict[str, str] = {}  # family:revision -> ARN
        self._world_lock = threading.RLock()
        self._stop = threading.Event()
        self._driver: threading.Thread | None = None
        self._stack = contextlib.ExitStack()
        self._mono0 = 0.0
        self._sim0 = 0.0
        self.slipped_seconds = 0.0  # simulated time the driver gave up on (it could not keep up)
        self._slip_noted = 0.0
        self._history_shown: dict[str, int] = {}  # job id -> history entries printed
        self._watching: set[str] = set()  # jobs not ended (or not every entry printed)
        self._printed = {"timeline": 0, "agents": 0, "notifications": 0, "dead_letters": 0, "failures": 0}
        self._notes: list[tuple[float, str, str]] = []  # (time, node, text) of the playground itself
        self._last_console = 0.0
        self._activity: tuple[int, ...] = ()  # what changes when a job may have changed
        self._api_calls = 0  # changing jobs-API and control-API calls
        #: the console shows the cluster from when this is set (after the banner)
        self.console_open = threading.Event()
        self.driver_errors: list[str] = []

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Playground:
        try:
            self._build(self._stack)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def _build(self, stack: contextlib.ExitStack) -> None:
        import warnings

        from gpu_recovery.queue.jobs_api.triggers import CallbackSchedulerTrigger
        from handlers import heartbeat_sweep, jobs_api, queue_scheduler
        from local_mode.ecs_sim import SimulatedEcs
        from local_mode.emulator import LocalAws
        from local_mode.event_bus import LambdaContext, LocalEventBus, wire_recovery_handlers
        from local_mode.harness import loopback_without_proxy, reset_handler_caches, silence_handler_logs
        from local_mode.node_agents import SimulatedNodeAgents

        cfg = self.config
        warnings.filterwarnings("ignore")
        stack.enter_context(loopback_without_proxy())
        saved_stdout = sys.stdout
        sys.stdout = _StdoutWithoutEmf(saved_stdout)  # type: ignore[assignment]
        stack.callback(setattr, sys, "stdout", saved_stdout)
        # Before the emulator (it resets the boto3 session) and after it: the handlers'
        # cached services must be built on the emulator's hooked session.
        reset_handler_caches()
        stack.callback(reset_handler_caches)
        # The API's port first: its URL is the launcher's JOB_CONTROL_API_URL. It serves
        # once everything below exists (and stops first).
        try:
            server = LocalApiServer(PlaygroundApi(self), port=cfg.port, clock=lambda: gr_clock.now())
        except OSError as error:
            raise PlaygroundError(f"cannot listen on 127.0.0.1:{cfg.port} ({error.strerror}): "
                                  "pick another --port") from error
        stack.callback(server._httpd.server_close)
        self.server = server
        self.local = stack.enter_context(LocalAws(
            max_recovery_attempts=3, metrics_disabled=True, reboot_timeout_minutes=30,
            extra_env={"POWERTOOLS_LOG_LEVEL": "WARNING" if cfg.verbose else "CRITICAL",
                       C.ENV_JOBS_ADMIN_ROLES: ",".join(self.admins),
                       C.ENV_CONTROL_API_URL: f"{server.url}/prod",
                       C.ENV_CONTROL_POLL_SECONDS: str(self.control_poll_seconds)}))
        if not cfg.verbose:
            silence_handler_logs()
            for name in ("job-control-api", "job-control-authorizer", "gpu_recovery_client", "werkzeug"):
                import logging

                logging.getLogger(name).setLevel(logging.CRITICAL)
        self.bus = LocalEventBus(duplicate_delivery=cfg.duplicate_delivery)
        self.sim = SimulatedEcs(self.local, self.bus, start=time.time(), train_seconds=cfg.run_seconds,
                                reboot_seconds=cfg.reboot_seconds, dcgm_seconds=cfg.dcgm_seconds)
        wire_recovery_handlers(self.bus, self.local.cluster_arn, sweep_every_seconds=SCHEDULE_SECONDS)
        self._show_gang_batches()
        self.bus.add_schedule("heartbeat-sweep", SCHEDULE_SECONDS, heartbeat_sweep.lambda_handler,
                              "heartbeat_sweep")
        self.bus.add_schedule("queue-scheduler", SCHEDULE_SECONDS, queue_scheduler.lambda_handler,
                              "queue_scheduler")

        def tick_now(payload: dict[str, Any]) -> None:
            # What the API's asynchronous Invoke of the scheduler does, in process.
            try:
                queue_scheduler.lambda_handler(payload, LambdaContext("queue_scheduler"))
            except Exception as error:  # an async invoke failure: shown, never raised
                self.note("-", f"!! queue scheduler (invoked by the API) failed: "
                               f"{type(error).__name__}: {error}")

        jobs_api.set_scheduler_trigger(CallbackSchedulerTrigger(tick_now))
        log_locations = self._register_task_definitions()
        for i in range(1, cfg.nodes + 1):
            self.sim.add_node(f"node-{i}", gpus=cfg.gpus_per_node)
        self.agents = SimulatedNodeAgents(self.sim, server.url, interval=AGENT_INTERVAL_SECONDS)
        self.agents.start(first_at=self.sim.now() + 1)
        self.sim.gpu_reporter = self._report_gpu_over_http
        state_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-playground-"))
        self.programs = TrainingPrograms(self.sim, log_locations, run_seconds=cfg.run_seconds,
                                         state_dir=state_dir, note=self._note_at)
        self.programs.start()
        self._start_aws_server(stack)
        stack.enter_context(server)  # serving from here on
        self._mono0, self._sim0 = time.monotonic(), self.sim.now()
        self._driver = threading.Thread(target=self._drive, name="playground-driver", daemon=True)
        self._driver.start()
        stack.callback(self._stop_driver)

    def _show_gang_batches(self) -> None:
        """A gang of more than ``INLINE_MAX_RANKS`` ranks is stopped and started in batches
        through the gang queue (wired by ``wire_recovery_handlers``, as in ``make demo``):
        the console shows each batch the gang worker receives (once, not its duplicate)."""
        from local_mode.event_bus import GANG_QUEUE

        queue = self.bus.queues.get(GANG_QUEUE)
        if queue is None:
            return
        worker, shown = queue.target, set[tuple[Any, Any]]()

        def noted_worker(event: dict[str, Any], context: Any) -> Any:
            for record in event.get("Records") or []:
                receives = (record.get("attributes") or {}).get("ApproximateReceiveCount")
                key = (record.get("messageId"), receives)
                if key in shown:
                    continue
                shown.add(key)
                with contextlib.suppress(KeyError, ValueError, TypeError, AttributeError):
                    batch = json.loads(record["body"])
                    again = f" (receive {receives})" if receives not in (None, "1") else ""
                    self.note("gang", f"worker: {batch['op']} ranks {batch['first']}.."
                                      f"{int(batch['last']) - 1} of job {batch['job_id']} (attempt "
                                      f"{batch['attempt']}){again}")
            return worker(event, context)

        queue.target = noted_worker

    def _register_task_definitions(self) -> dict[str, tuple[str, str, str]]:
        ecs, logs = self.local.client("ecs"), self.local.client("logs")
        locations: dict[str, tuple[str, str, str]] = {}
        families = dict(DOCUMENTED_TASK_DEFINITIONS)
        for family, revision in example_task_definitions(self.config.examples_dir).items():
            families[family] = max(revision, families.get(family, 0))
        for family, revisions in sorted(families.items()):
            group, prefix, container = f"/ecs/{family}", "train", "trainer"
            logs.create_log_group(logGroupName=group)
            for _ in range(revisions):  # family:N exists once N revisions were registered
                arn = ecs.register_task_definition(
                    family=family, requiresCompatibilities=["EC2"], networkMode="host",
                    containerDefinitions=[{
                        "name": container, "image": f"{family}:latest", "memory": 4096, "essential": True,
                        "resourceRequirements": [{"type": "GPU", "value": str(self.config.gpus_per_node)}],
                        "logConfiguration": {"logDriver": "awslogs", "options": {
                            "awslogs-group": group, "awslogs-region": self.local.region,
                            "awslogs-stream-prefix": prefix}},
                    }])["taskDefinition"]["taskDefinitionArn"]
            self.task_definitions[arn.rsplit("/", 1)[-1]] = arn
            locations[family] = (group, prefix, container)
        return locations

    def _start_aws_server(self, stack: contextlib.ExitStack) -> None:
        """The emulator over HTTP (moto's server, sharing this process's emulated
        account), for the operator CLI: ``AWS_ENDPOINT_URL``."""
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as error:  # flask missing: the admin commands cannot reach the tables
            self.note("-", f"!! no AWS endpoint for gpu-recovery-admin ({error}); run make install")
            return
        port = self.config.aws_port
        if port:  # moto's server would wait forever on a port in use: check first
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError as error:
                    raise PlaygroundError(f"cannot listen on 127.0.0.1:{port} ({error.strerror}): "
                                          "pick another --aws-port") from error
        self.aws_server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.aws_server.start()
        stack.callback(self.aws_server.stop)
        host, bound = self.aws_server.get_host_and_port()
        self.aws_url = f"http://{host}:{bound}"

    @property
    def admins(self) -> list[str]:
        """Admin roles of the jobs API: ``admin`` and whoever runs the playground."""
        try:  # as the CLI names its caller: $USER, else the login name
            user = os.environ.get("USER") or getpass.getuser()
        except Exception:  # no passwd entry (containers)
            user = ""
        return sorted({"admin", user} - {""})

    @property
    def control_poll_seconds(self) -> int:
        low, high = CONTROL_POLL_SECONDS
        return int(min(high, max(low, round(self.config.speed / 2))))

    # ------------------------------------------------------------------ time
    def sim_target(self) -> float:
        """Where simulated time should be now: the start + wall time elapsed x speed."""
        return self._sim0 + (time.monotonic() - self._mono0) * self.config.speed

    @contextlib.contextmanager
    def world(self) -> Iterator[None]:
        """Hold the simulation still (the driver steps under this lock)."""
        with self._world_lock:
            yield

    def _advance(self) -> None:
        """Run the simulation towards its target for at most ``MAX_HOLD_SECONDS`` of wall
        time, a simulated second at a time; slow down when it cannot keep up."""
        deadline = time.monotonic() + MAX_HOLD_SECONDS
        target = self.sim_target()
        while self.sim.now() < target and time.monotonic() < deadline:
            self.sim.run_until(min(target, self.sim.now() + SIM_CHUNK_SECONDS))
        lag = self.sim_target() - self.sim.now()
        allowed = MAX_LAG_SECONDS * self.config.speed
        if lag > allowed:
            self._sim0 -= lag - allowed
            self.slipped_seconds += lag - allowed
            if self.slipped_seconds - self._slip_noted >= 60:
                self._slip_noted = self.slipped_seconds
                self.note("-", f"!! the playground cannot keep up with --speed {self.config.speed:g}: "
                               f"{self.slipped_seconds:.0f} simulated seconds dropped so far (try a lower "
                               "speed)")

    def _drive(self) -> None:
        while not self._stop.wait(DRIVER_TICK_SECONDS):
            try:
                with self.world():
                    self._advance()
                    due = time.monotonic() - self._last_console >= CONSOLE_EVERY_SECONDS
                    lines = self._console_lines() if due and self.console_open.is_set() else []
                self.console.print(*lines)
            except Exception as error:  # keep the cluster alive; say what broke
                message = f"{type(error).__name__}: {error}"
                self.driver_errors.append(message)
                self.console.print(f"!! playground driver: {message}")

    def _stop_driver(self) -> None:
        self._stop.set()
        if self._driver is not None:
            self._driver.join(timeout=10)

    # ------------------------------------------------------------------ the console
    def note(self, node: str, text: str) -> None:
        self._note_at(self.sim.now() if self.sim is not None else time.time(), node, text)

    def _note_at(self, at: float, node: str, text: str) -> None:
        self._notes.append((at, node, text))

    def track(self, job_id: str) -> None:
        """Show this job's state changes on the console (from its first)."""
        if job_id not in self._history_shown:
            self._history_shown[job_id] = 0
            self._watching.add(job_id)

    def api_called(self, method: str, path: str, headers: dict[str, str], response: ApiResponse) -> None:
        if method == "GET":
            return
        self._api_calls += 1
        user = next((v for k, v in headers.items() if k.lower() == "x-local-user"), "local")
        doc: Any = {}
        with contextlib.suppress(ValueError):
            doc = response.json()
        if method == "POST" and path == "/v1/jobs" and response.status == 201 and isinstance(doc, dict):
            self.track(str(doc.get("job_id")))
        detail = ""
        if response.status >= 400 and isinstance(doc, dict):
            detail = f": {doc.get('message') or doc.get('error') or ''}"
        self.note("api", f"{user}: {method} {path} -> {response.status}{detail}")

    def _console_lines(self) -> list[str]:
        """What happened since the last look, in time order (called by the driver)."""
        self._last_console = time.monotonic()
        entries: list[tuple[float, int, str]] = []
        timeline = self.sim.timeline
        for seq, entry in enumerate(timeline[self._printed["timeline"]:]):
            if entry.kind != "schedule":
                entries.append((entry.time, seq, f"{_hms(entry.time)}  {entry.text}"))
        self._printed["timeline"] = len(timeline)
        agents = self.agents.timeline
        for at, node, text, _label in agents[self._printed["agents"]:]:
            entries.append((at, 10**6, f"{_hms(at)}  {node:<8}  {text}"))
        self._printed["agents"] = len(agents)
        notes, self._notes = self._notes, []
        for at, node, text in notes:
            entries.append((at, 10**6, f"{_hms(at)}  {node:<8}  {text}"))
        entries += self._job_changes()
        entries.sort(key=lambda e: (e[0], e[1]))
        lines = [text for _, _, text in entries]
        failures = self.bus.failures()
        for delivery in failures[self._printed["failures"]:]:
            lines.append(f"!! {delivery.target} failed on {delivery.detail_type} (attempt "
                         f"{delivery.attempt}): {(delivery.error or '')[:300]}")
        self._printed["failures"] = len(failures)
        for dead in self.bus.dead_letters[self._printed["dead_letters"]:]:
            lines.append(f"!! event for {dead.target} in its dead-letter queue: {dead.error}")
        self._printed["dead_letters"] = len(self.bus.dead_letters)
        if self.programs is not None and self.programs.errors:
            lines += [f"!! training program: {e}" for e in self.programs.errors]
            self.programs.errors.clear()
        notifications = self.local.notifications()
        for note in notifications[self._printed["notifications"]:]:
            lines += self._email(note)
        self._printed["notifications"] = len(notifications)
        return lines

    def _job_changes(self) -> list[tuple[float, int, str]]:
        """New history entries of the jobs not ended. A job changes only when a handler
        ran: an event delivered, a node report, an API call (reading every job's item is
        not free in the emulator: only then)."""
        from handlers import jobs_api

        out: list[tuple[float, int, str]] = []
        if self.programs is not None:
            for program in self.programs.ranks.values():
                self.track(program.job_id)
        activity = (len(self.bus.deliveries), self.agents.results.accepted, len(self.sim.timeline),
                    len(self._history_shown), self._api_calls)
        if activity == self._activity:
            return out
        self._activity = activity
        for job_id in sorted(self._watching):
            shown = self._history_shown[job_id]
            try:
                doc = jobs_api.service().events(job_id)
            except Exception:  # not a queue job (or gone): nothing to show
                self._watching.discard(job_id)
                continue
            events = doc.get("events") or []
            for event in events[shown:]:
                at = float(event.get("at") or 0)
                out.append((at, 10**7, f"{_hms(at)}  {'job':<8}  {job_id} -> {event.get('to')}: "
                                       f"{event.get('reason')}"))
            self._history_shown[job_id] = len(events)
            if doc.get("state") in TERMINAL and len(events) == shown:
                self._watching.discard(job_id)
        return out

    @staticmethod
    def _email(note: dict[str, Any]) -> list[str]:
        kind = note["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE, "?")
        message = note["message"]
        text = message if isinstance(message, str) else json.dumps(message, indent=2)
        rule = "-" * 78
        return [rule, f"E-mail to the operators (SNS, event_kind={kind})", f"Subject: {note['subject']}", "",
                *text.splitlines(), rule]

    # ------------------------------------------------------------------ node agents
    def _report_gpu_over_http(self, node: str, body: dict[str, Any]) -> Any:
        """The node agent's ``POST /v1/report_gpu`` with the node's token (retried by the
        simulator as the agent retries)."""
        agent = self.agents.agent
        url = agent.join_url(self.agents.api_url, "/v1/report_gpu")
        result = agent.post_json(url, body, self.agents.tokens[node], time.monotonic() + 5.0,
                                 self.agents.config, time.monotonic, lambda _s: None)
        if not result.ok:
            raise RuntimeError(f"report_gpu answered {result.status}: {result.error}")
        return result

    # ------------------------------------------------------------------ local routes
    def local_route(self, method: str, path: str, body: bytes) -> ApiResponse:
        routes: dict[tuple[str, str], Callable[[dict[str, Any]], tuple[int, Any]]] = {
            ("GET", LOCAL_PREFIX): lambda _doc: (200, self.describe()),
            ("GET", f"{LOCAL_PREFIX}/nodes"): lambda _doc: (200, {"nodes": self.nodes()}),
            ("POST", f"{LOCAL_PREFIX}/faults"): lambda doc: (202, self.inject(doc)),
        }
        route = routes.get((method, path.rstrip("/") or "/"))
        if route is None:
            known = ", ".join(f"{m} {p}" for m, p in routes)
            return _answer(404, {"error": "NOT_FOUND",
                                 "message": f"no local route {method} {path} ({known})"})
        try:
            doc = json.loads(body or b"{}")
            if not isinstance(doc, dict):
                raise PlaygroundError("the body must be a JSON object")
            with self.world():
                status, payload = route(doc)
        except ValueError as error:  # bad JSON
            return _answer(400, {"error": "BAD_REQUEST", "message": f"body: {error}"})
        except PlaygroundError as error:
            return _answer(error.status, {"error": "BAD_REQUEST" if error.status == 400 else "NOT_FOUND",
                                          "message": str(error), "field": error.field})
        return _answer(status, payload)

    def describe(self) -> dict[str, Any]:
        return {"api": self.server.url if self.server else "", "aws_endpoint": self.aws_url,
                "speed": self.config.speed, "simulated_time": _iso(self.sim.now()),
                "simulated_seconds_dropped": round(self.slipped_seconds, 1),
                "nodes": len(self.sim.nodes), "task_definitions": sorted(self.task_definitions),
                "run_minutes": self.config.run_minutes}

    def nodes(self) -> list[dict[str, Any]]:
        out = []
        for name in sorted(self.sim.nodes, key=lambda n: (len(n), n)):
            node = self.sim.nodes[name]
            tasks = []
            for task in self.sim.running_tasks(name):
                tags = task.tags
                tasks.append({"job_id": tags.get(C.TAG_JOB_ID), "rank": tags.get(C.TAG_RANK),
                              "attempt": tags.get(C.TAG_ATTEMPT), "state": task.last_status,
                              "health_check": task.health_check, "gpus": len(task.gpu_ids)})
            out.append({"name": name, "instance_id": node.instance_id,
                        "container_instance_id": node.container_instance_id,
                        "status": self.sim._ci_status(node), "agent_connected": node.agent_connected,
                        "rebooting": node.rebooting, "health": node.health, "gpus": len(node.gpu_ids),
                        "free_gpus": len(node.free_gpu_ids), "reboots": node.reboots, "tasks": tasks})
        return out

    def _target(self, doc: dict[str, Any]) -> tuple[Any, Any]:
        """(node, the rank's task or None) named by ``node``, or by ``job_id`` + ``rank``."""
        node_ref, job_id = doc.get("node"), doc.get("job_id")
        if bool(node_ref) == bool(job_id):
            raise PlaygroundError("name either node or job_id (with rank)", field="node")
        if node_ref:
            try:
                return self.sim.node(str(node_ref)), None
            except KeyError:
                raise PlaygroundError(f"no node {node_ref} (nodes: {', '.join(sorted(self.sim.nodes))})",
                                      field="node", status=404) from None
        rank = _int(doc, "rank", 0)
        tasks = [t for t in self.sim.running_tasks() if not t.health_check
                 and t.tags.get(C.TAG_JOB_ID) == job_id and t.tags.get(C.TAG_RANK) == str(rank)]
        if not tasks:
            raise PlaygroundError(f"job {job_id} has no rank {rank} on a node now (not started, between "
                                  "attempts, or ended)", field="job_id", status=404)
        task = max(tasks, key=lambda t: int(t.tags.get(C.TAG_ATTEMPT, "0") or 0))
        return self.sim.nodes[task.node], task

    def inject(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Inject the fault ``doc`` describes, now; returns what was done."""
        kind = str(doc.get("kind") or "").replace("-", "_")
        if kind not in FAULT_KINDS:
            raise PlaygroundError(f"kind: one of {', '.join(FAULT_KINDS)}", field="kind")
        node, task = self._target(doc)
        assert self.programs is not None
        if kind == "xid":
            xid = _int(doc, "xid", None)
            if xid is None or not 1 <= xid <= 999:
                raise PlaygroundError("xid: an XID number (1..999), e.g. 79", field="xid")
            gpu = self._gpu(doc, node)
            health = self._health(doc, "replace" if xid in REPLACE_XIDS else
                                  "healthy" if xid in APPLICATION_XIDS else "reboot_fixable")
            crash = f"RuntimeError: CUDA error: {CUDA_ERRORS.get(xid, 'unspecified launch failure')} " \
                    f"(GPU {gpu}; the kernel log has Xid {xid})"
            self.programs.mark_crash(node.name, crash, "NCCL error: remote process exited or there was a "
                                                       "network error (a peer rank died)")
            self.sim.inject_xid(node.name, xid, gpu=gpu, health=health, nccl_cascade=True)
            detail = (f"XID {xid} on GPU {gpu} of {node.name}: the node agent reports it within a second, "
                      f"the ranks there crash 3 s later (a health check would find the node {health})")
        elif kind == "dead_gpu":
            gpu = self._gpu(doc, node)
            self.programs.mark_crash(
                node.name, f"RuntimeError: CUDA error: uncorrectable ECC error encountered (GPU {gpu})",
                "NCCL error: remote process exited or there was a network error (a peer rank died)")
            self.sim.inject_gpu_fault(node.name, health="replace", exit_code=1, nccl_cascade=True)
            detail = (f"GPU {gpu} of {node.name} is dead: its ranks exit 1 now, the DCGM diag will say "
                      "replace")
        elif kind == "flap":
            seconds = _number(doc, "seconds", 30.0, 5, 3600)
            times = int(_number(doc, "times", 3, 1, 20))
            for i in range(times):
                self.sim.disconnect_agent(node.name, after=i * 2 * seconds, for_seconds=seconds)
            detail = (f"the ECS agent of {node.name} disconnects {times} time(s) for {seconds:g} s, "
                      f"{2 * seconds:g} s apart (the tasks keep running)")
        elif kind == "app_error":
            if task is None:
                running = [t for t in self.sim.running_tasks(node.name) if not t.health_check]
                if not running:
                    raise PlaygroundError(f"nothing runs on {node.name}", field="node", status=404)
                task = running[0]
            exit_code = _int(doc, "exit_code", 1)
            if exit_code is None or not 1 <= exit_code <= 255:
                raise PlaygroundError("exit_code: 1..255", field="exit_code")
            self.programs.death_causes[task.arn] = (
                f"Traceback (most recent call last): ... ValueError: loss is NaN; exiting with status "
                f"{exit_code}")
            self.sim.inject_task_exit(task.arn, exit_code, after=0, why="application error injected")
            detail = (f"{task.label} on {node.name} exits {exit_code} (an application error: the GPUs are "
                      "healthy)")
        else:  # lost_node
            seconds = _number(doc, "seconds", 300.0, 10, 86400)
            now = self.sim.now()
            self.agents.silence(node.name, now, now + seconds)
            detail = (f"the node agent of {node.name} sends nothing for {seconds:g} s (ECS still sees the "
                      "node): its ranks miss their heartbeats")
        self.note("admin", f"fault injected: {detail}")
        return {"kind": kind, "node": node.name, "container_instance_id": node.container_instance_id,
                "at": _iso(self.sim.now()), "detail": detail}

    def _gpu(self, doc: dict[str, Any], node: Any) -> int:
        gpu = _int(doc, "gpu", 0)
        if gpu is None or not 0 <= gpu < len(node.gpu_ids):
            raise PlaygroundError(f"gpu: 0..{len(node.gpu_ids) - 1}", field="gpu")
        return gpu

    @staticmethod
    def _health(doc: dict[str, Any], default: str) -> str:
        from local_mode.ecs_sim import HEALTH_VALUES

        if doc.get("persistent"):
            return "persistent_reboot"
        health = str(doc.get("health") or default)
        if health not in HEALTH_VALUES:
            raise PlaygroundError(f"health: one of {', '.join(HEALTH_VALUES)}", field="health")
        return health

    # ------------------------------------------------------------------ what to tell the user
    def environment(self) -> dict[str, str]:
        """What a shell needs to use the CLIs against this playground."""
        assert self.server is not None
        env = {"GPUJOBS_ENDPOINT": self.server.url}
        if self.aws_url:
            # The emulator's fake credentials (any value works; never real ones).
            env.update(AWS_ENDPOINT_URL=self.aws_url, AWS_ACCESS_KEY_ID="testing",
                       AWS_SECRET_ACCESS_KEY="testing", AWS_REGION=self.local.region,  # noqa: S106
                       AWS_DEFAULT_REGION=self.local.region)
        return env

    def banner(self) -> list[str]:
        cfg = self.config
        nodes = ", ".join(sorted(self.sim.nodes, key=lambda n: (len(n), n)))
        exports = [f"export {k}={v}" for k, v in self.environment().items()]
        speed = "real time" if cfg.speed == 1 else f"{cfg.speed:g}x real time"
        return [
            "GPU training recovery: local playground (the deployed handlers on an emulated AWS account)",
            "=" * 78,
            f"cluster:  {cfg.nodes} nodes x {cfg.gpus_per_node} GPUs ({nodes}), simulated clock at {speed}",
            f"jobs:     every training job runs {cfg.run_minutes:g} simulated minutes (checkpoint every "
            f"{CHECKPOINT_EVERY_STEPS * PROGRAM_TICK_SECONDS:g} s), reboots take {cfg.reboot_seconds:g} s, "
            f"a DCGM diag {cfg.dcgm_seconds:g} s",
            f"task definitions: {', '.join(sorted(self.task_definitions))}",
            f"local API:    {self.server.url if self.server else ''}  (jobs, node and control routes; "
            f"{LOCAL_PREFIX}/... local-only)",
            f"AWS endpoint: {self.aws_url or '(none)'}  (DynamoDB and the rest, for gpu-recovery-admin)",
            "",
            "In another terminal, in this directory:",
            "  source .venv/bin/activate                            # gpujobs, gpu-recovery-admin",
            *[f"  {line}" for line in exports],
            "  gpujobs submit -f examples/job.yaml                  # prints the job id",
            "  gpu-recovery-admin inject-fault xid 79 --job <job id> --rank 1  # a GPU falls off the bus",
            "  gpujobs watch <job id>                               # its recovery, live, until COMPLETE",
            "",
            "More: gpujobs list | logs <id> | suspend <id> | resume <id> | quota; gpu-recovery-admin",
            "inject-fault nodes | dead-gpu | flap | app-error | lost-node; quota set; breaker show.",
            f"Users: the CLI acts as $USER; {' and '.join(self.admins)} are admins here (every job, every",
            "quota); USER=bob gpujobs ... acts as bob.",
            "Ctrl-C stops the playground (everything is in memory).",
            "=" * 78,
        ]

    def serve_forever(self) -> None:
        self.console.print(*self.banner())
        self.console_open.set()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            self.console.print("", "playground stopped")


def _int(doc: dict[str, Any], name: str, default: int | None) -> int | None:
    value = doc.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).lstrip("-").isdigit():
        raise PlaygroundError(f"{name}: an integer", field=name)
    return int(value)


def _number(doc: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = doc.get(name, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PlaygroundError(f"{name}: a number", field=name) from None
    if isinstance(value, bool) or not low <= number <= high:
        raise PlaygroundError(f"{name}: {low:g}..{high:g}", field=name)
    return number


def _stop_on_signals() -> None:
    """Ctrl-C (SIGINT) and SIGTERM stop the playground cleanly, even when it was started in
    the background by a shell that ignores SIGINT for background jobs (``make playground &``)."""
    import signal

    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m local_mode.playground",
        description="A local GPU cluster behind the local REST API: submit, watch, fault and recover jobs "
                    "with gpujobs and gpu-recovery-admin.")
    defaults = PlaygroundConfig()
    parser.add_argument("--nodes", type=int, default=defaults.nodes, help="GPU nodes (default %(default)s)")
    parser.add_argument("--gpus", type=int, default=defaults.gpus_per_node, dest="gpus_per_node",
                        help="GPUs per node (default %(default)s)")
    parser.add_argument("--speed", type=float, default=defaults.speed,
                        help="simulated seconds per wall second (default %(default)s: real time)")
    parser.add_argument("--port", type=int, default=defaults.port,
                        help="local API port (default %(default)s; 0: any free port)")
    parser.add_argument("--aws-port", type=int, default=defaults.aws_port,
                        help="emulated AWS endpoint port (default %(default)s; 0: any free port)")
    parser.add_argument("--run-minutes", type=float, default=defaults.run_minutes,
                        help="simulated minutes every training job runs (default %(default)s; a job's "
                             "PLAYGROUND_RUN_MINUTES environment variable sets its own)")
    parser.add_argument("--reboot-seconds", type=float, default=defaults.reboot_seconds,
                        help=f"how long a node takes to reboot (default %(default)s, at least "
                             f"{MIN_REBOOT_SECONDS})")
    parser.add_argument("--dcgm-seconds", type=float, default=defaults.dcgm_seconds,
                        help="how long a DCGM health check takes (default %(default)s)")
    parser.add_argument("--once", action="store_true", help="deliver every event once (default: twice)")
    parser.add_argument("--verbose", action="store_true", help="also print the handlers' warnings")
    args = parser.parse_args(argv)
    try:
        config = PlaygroundConfig(
            nodes=args.nodes, gpus_per_node=args.gpus_per_node, speed=args.speed, port=args.port,
            aws_port=args.aws_port, run_minutes=args.run_minutes, reboot_seconds=args.reboot_seconds,
            dcgm_seconds=args.dcgm_seconds, duplicate_delivery=not args.once, verbose=args.verbose).validate()
    except ValueError as error:
        parser.error(str(error))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    _stop_on_signals()
    try:
        with Playground(config) as playground:
            playground.serve_forever()
    except PlaygroundError as error:
        print(f"playground: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
