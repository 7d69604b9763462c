"""The playground itself: builds the emulated account, the simulated cluster, the real
handlers and the local API (as ``make demo`` does), then drives simulated time from the
wall clock (optionally accelerated) on its own thread while the API serves requests."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpu_recovery import clock as gr_clock
from gpu_recovery import constants as C
from local_mode.playground.config import (
    DOCUMENTED_TASK_DEFINITIONS,
    PlaygroundConfig,
    PlaygroundError,
    example_task_definitions,
)
from local_mode.playground.console import Console, ConsoleFeed, StdoutWithoutEmf
from local_mode.playground.fault_injection import FaultInjector
from local_mode.playground.local_routes import LOCAL_PREFIX, PlaygroundApi
from local_mode.playground.stack_outputs import (
    OUTPUTS_FILE_ENV,
    create_stack_resources,
    mirror_dead_letters,
    write_outputs_file,
)
from local_mode.server import ApiResponse, LocalApiServer
from local_mode.training_programs import CHECKPOINT_EVERY_STEPS, PROGRAM_TICK_SECONDS, TrainingPrograms

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


class Playground:
    """See the package docstring. A context manager; :meth:`serve_forever` for ``main``."""

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
        self.feed = ConsoleFeed()
        self._last_console = 0.0
        self.fault_injector: FaultInjector | None = None
        self.stack_outputs: dict[str, str] = {}
        self.outputs_file: Path | None = None
        self._dead_letters_mirrored = 0
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

        from local_mode.harness import loopback_without_proxy, reset_handler_caches, silence_handler_logs
        from local_mode.node_agents import SimulatedNodeAgents
        from local_mode.world import build_world

        cfg = self.config
        warnings.filterwarnings("ignore")
        stack.enter_context(loopback_without_proxy())
        saved_stdout = sys.stdout
        sys.stdout = StdoutWithoutEmf(saved_stdout)  # type: ignore[assignment]
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
        world = stack.enter_context(build_world(
            duplicate_delivery=cfg.duplicate_delivery, sweep_every_seconds=SCHEDULE_SECONDS,
            train_seconds=cfg.run_seconds, real_time_start=True,
            sim_options={"reboot_seconds": cfg.reboot_seconds, "dcgm_seconds": cfg.dcgm_seconds},
            max_recovery_attempts=3, reboot_timeout_minutes=30,
            # The health check (and a validation after repair) takes a whole node's GPUs.
            health_check_gpus=cfg.gpus_per_node,
            extra_env={"POWERTOOLS_LOG_LEVEL": "WARNING" if cfg.verbose else "CRITICAL",
                       **({C.ENV_REMEDIATION_SETTINGS: json.dumps(cfg.remediation_settings)}
                          if cfg.remediation_settings else {}),
                       C.ENV_POST_REPAIR_VALIDATION: cfg.validation().to_json(),
                       C.ENV_JOBS_ADMIN_ROLES: ",".join(self.admins),
                       C.ENV_CONTROL_API_URL: f"{server.url}/prod",
                       C.ENV_CONTROL_POLL_SECONDS: str(self.control_poll_seconds)}))
        if not cfg.verbose:
            silence_handler_logs()
            for name in ("job-control-api", "job-control-authorizer", "gpu_recovery_client", "werkzeug"):
                import logging

                logging.getLogger(name).setLevel(logging.CRITICAL)
        self.local, self.bus, self.sim = world.aws, world.bus, world.ecs
        self._show_gang_batches()
        world.schedule_heartbeat_sweep(SCHEDULE_SECONDS)
        world.schedule_queue_scheduler(SCHEDULE_SECONDS)
        world.invoke_scheduler_in_process(
            lambda error: self.note("-", f"!! queue scheduler (invoked by the API) failed: "
                                         f"{type(error).__name__}: {error}"))
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
        self.fault_injector = FaultInjector(self.sim, self.programs, self.agents, self.note, repo=world.repo)
        # What doctor reads of a deployed stack (rules, dead-letter queues, PITR, the outputs).
        self.stack_outputs = create_stack_resources(self.local, cluster_arn=self.local.cluster_arn,
                                                    tag_key=self.sim.node_tag_key)
        self._start_aws_server(stack)
        if self.aws_url:  # named after the endpoint's port: the one the banner's exports name
            port = self.aws_url.rsplit(":", 1)[-1]
            self.outputs_file = write_outputs_file(self.stack_outputs,
                                                   Path(tempfile.gettempdir()) / f"gpu-playground-{port}")
            stack.callback(self.outputs_file.unlink, missing_ok=True)
        stack.enter_context(server)  # serving from here on
        self._mono0, self._sim0 = time.monotonic(), self.sim.now()
        self._driver = threading.Thread(target=self._drive, name="playground-driver", daemon=True)
        self._driver.start()
        stack.callback(self._stop_driver)


    def _show_gang_batches(self) -> None:
        """A gang of more than ``gang_inline_max_ranks`` (16) ranks is stopped and started in batches
        through the gang queue (wired by ``wire_recovery_handlers``, as in ``make demo``):
        the console shows each batch the gang worker receives (once, not its duplicate)."""
        from local_mode.sim.wiring import GANG_QUEUE

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
        self.feed.note_at(at, node, text)

    def api_called(self, method: str, path: str, headers: dict[str, str], response: ApiResponse) -> None:
        self.feed.api_called(method, path, headers, response,
                             self.sim.now() if self.sim is not None else time.time())

    def _console_lines(self) -> list[str]:
        """What happened since the last look, in time order (called by the driver)."""
        self._last_console = time.monotonic()
        dead = self.bus.dead_letters[self._dead_letters_mirrored:]
        if dead:  # doctor reads them in the dead-letter queues, as in a deployed stack
            self._dead_letters_mirrored += len(dead)
            mirror_dead_letters(self.local, self.stack_outputs, list(dead))
        return self.feed.lines(self.sim, self.agents, self.bus, self.programs, self.local)


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
    def inject(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``POST /local/faults``: inject the fault ``doc`` describes, now."""
        if self.fault_injector is None:
            raise PlaygroundError("the playground is not running", status=404)
        return self.fault_injector.inject(doc)

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
            if self.outputs_file is not None:  # gpu-recovery-admin doctor reads the stack's outputs there
                env[OUTPUTS_FILE_ENV] = str(self.outputs_file)
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
            '  gpujobs logs <job id> --follow | grep -m1 "checkpoint saved"   # its first checkpoint',
            "  gpu-recovery-admin inject-fault xid 79 --job <job id> --rank 1  # a GPU falls off the bus",
            "  gpujobs watch <job id>                               # its recovery, live, until COMPLETE",
            "  gpujobs logs <job id> | grep resuming                # attempt 2 resumed from the checkpoint",
            *([f"(at {speed} the walk takes about 15 minutes: make playground PLAYGROUND_ARGS=\"--speed 10\" "
               "takes 1.5)"] if cfg.speed < 5 else []),
            "",
            "More: gpujobs list | logs <id> | suspend <id> | resume <id> | quota; gpu-recovery-admin",
            "inject-fault nodes | dead-gpu | flap | app-error | lost-node; quota set; breaker show; doctor.",
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
                # Short sleeps: a Ctrl-C the kernel hands to another thread reaches Python's
                # handler only when the main thread next runs, not at the end of a long sleep.
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.console.print("", "playground stopped")

