"""The program inside every training container of the local playground, in simulated time.

A job is ``total_steps`` steps of ``PROGRAM_TICK_SECONDS`` (the playground's
``--run-minutes``, or the job's own ``PLAYGROUND_RUN_MINUTES`` environment variable). Each
rank logs its progress to its task definition's ``awslogs`` group (the emulated CloudWatch
Logs, which ``gpujobs logs`` reads); rank 0 saves a checkpoint every
``CHECKPOINT_EVERY_STEPS`` steps; an attempt starts from the last checkpoint (a crash loses
the steps since) and its ranks exit 0 when the steps are done (``SimulatedEcs.plan_task``).
Rank 0 reports each checkpoint (``checkpoint_saved``: the job's goodput ledger measures a
fault's lost work from it) and asks ``receive_suspend_command()`` of the real training client
(``training_client/gpu_recovery_client.py``) every step; told, it saves a checkpoint and
calls ``go_suspend(block=False)``. A rank killed by an injected fault prints what
``mark_crash`` says (a CUDA error, an NCCL error) as its last line.

A rank whose command starts with the client's preflight wrapper (``python
gpu_recovery_client.py preflight -- ...``) first runs the gang preflight
(``local_mode.preflight_programs``: the real client's steps, each all-reduce on the simulated
fabric, its all_reduce_perf table in the rank's log); its training starts when the
preflight says so, and the attempt's steps count from then.
"""

from __future__ import annotations

import contextlib
import math
import shlex
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as C

PROGRAM_TICK_SECONDS = 2.0  # a training step: rank 0 asks the suspend channel once per step
LOG_EVERY_STEPS = 30
CHECKPOINT_EVERY_STEPS = 60
# A job's environment may set how long it runs here, in simulated minutes (1/60..10080).
RUN_MINUTES_ENV = "PLAYGROUND_RUN_MINUTES"

@dataclass
class _RankProgram:
    task_arn: str
    job_id: str
    rank: int
    world_size: int
    attempt: int
    node: str
    log_group: str
    log_stream: str
    env: dict[str, str]
    client: Any = None  # rank 0's SuspendClient
    held: bool = False  # in its preflight: no training step yet
    last_logged_step: int = -1
    told: bool = False
    suspended: bool = False
    ended: bool = False


@dataclass
class _AttemptRun:
    started_at: float
    first_step: int
    end_at: float
    total_steps: int
    held: bool = False  # its ranks run the preflight first: the steps count from its end


class TrainingPrograms:
    """The programs of every queue rank of the simulated cluster (see the module docstring)."""

    def __init__(self, sim: Any, log_locations: dict[str, tuple[str, str, str]], *, run_seconds: float,
                 state_dir: str, note: Callable[[float, str, str], None]) -> None:
        from local_mode.preflight_programs import PreflightPrograms
        from local_mode.scripts import load_client_library

        self.sim = sim
        self.log_locations = log_locations  # family -> (group, stream prefix, container)
        self.step_seconds = PROGRAM_TICK_SECONDS
        self.total_steps = max(1, round(run_seconds / self.step_seconds))
        self.state_dir = state_dir
        self.note = note
        self.client_lib = load_client_library()
        self.checkpoints: dict[str, int] = {}  # job id -> step of its last checkpoint
        self.runs: dict[tuple[str, int], _AttemptRun] = {}
        self.ranks: dict[str, _RankProgram] = {}  # task arn -> program
        self.death_causes: dict[str, str] = {}  # task arn -> the last lines it prints
        self.errors: list[str] = []
        self._logs_ready: set[tuple[str, str]] = set()
        self.preflights = PreflightPrograms(sim, self.client_lib, log=self._log_task,
                                            on_train=self._preflight_done)

    def start(self) -> None:
        self.sim.schedule(self.sim.now() + self.step_seconds, self._tick, "training programs")
        self.sim.container_start_listeners.append(self._container_started)

    def _container_started(self, task: Any) -> None:
        """The awslogs driver makes a rank's log stream as its container starts, before ECS
        reports the task RUNNING: ``gpujobs logs`` of a RUNNING job finds the stream (empty
        until the program's first step writes)."""
        location = self.log_locations.get(task.family)
        if task.health_check or location is None or C.TAG_JOB_ID not in task.tags:
            return
        group, prefix, container = location
        try:
            self._open_stream(group, _stream_name(prefix, container, task.arn))
        except Exception as error:  # a program's bug must not stop the cluster
            self.errors.append(f"{type(error).__name__}: {error}")

    # ------------------------------------------------------------------ the step
    def _tick(self) -> None:
        try:
            for task in self.sim.running_tasks():
                if task.health_check or task.last_status != "RUNNING" or C.TAG_JOB_ID not in task.tags:
                    continue
                program = self.ranks.get(task.arn) or self._attach(task)
                if program is not None and not program.ended:
                    self._step(program, task)
            for program in list(self.ranks.values()):
                task = self.sim.tasks.get(program.task_arn)
                if task is not None and task.done and not program.ended:
                    self._ended(program, task)
        except Exception as error:  # a program's bug must not stop the cluster
            self.errors.append(f"{type(error).__name__}: {error}")
        self.sim.schedule(self.sim.now() + self.step_seconds, self._tick, "training programs")

    def _attach(self, task: Any) -> _RankProgram | None:
        location = self.log_locations.get(task.family)
        if location is None:
            return None
        group, prefix, container = location
        override = (task.overrides.get("containerOverrides") or [{}])[0]
        env = {e["name"]: e["value"] for e in override.get("environment") or []}
        tags = task.tags
        program = _RankProgram(
            task_arn=task.arn, job_id=tags[C.TAG_JOB_ID], rank=int(tags.get(C.TAG_RANK, "0")),
            world_size=int(tags.get(C.TAG_WORLD_SIZE, "1")), attempt=int(tags.get(C.TAG_ATTEMPT, "1")),
            node=task.node, log_group=group,
            log_stream=_stream_name(prefix, container, task.arn), env=env)
        self.ranks[task.arn] = program
        key = (program.job_id, program.attempt)
        run = self.runs.get(key)
        if run is None:
            total = self._total_steps(env)
            first = min(self.checkpoints.get(program.job_id, 0), total)
            started = task.started_at or self.sim.now()
            run = _AttemptRun(started, first, started + (total - first) * self.step_seconds, total)
            self.runs[key] = run
        if self.preflights.attach(task, env):
            program.held = run.held = True  # the wrapper runs the preflight before the command
            self.sim.plan_task(task.arn, None)
        else:
            # Every rank of the attempt ends when the steps left are done (a fault stops it earlier).
            self.sim.plan_task(task.arn, max(0.0, run.end_at - self.sim.now()), exit_code=0)
        command = override.get("command") or []
        resume = env.get(C.RESUME_COUNT_ENV)
        lines = [f"rank {program.rank}/{program.world_size} on {task.node} ({len(task.gpu_ids)} GPUs), "
                 f"attempt {program.attempt}" + (f", {C.RESUME_COUNT_ENV}={resume}" if resume else "")
                 + (f": {shlex.join(command)[:200]}" if command else "")]
        if program.rank == 0:
            lines.append(f"resuming from the checkpoint at step {run.first_step}" if run.first_step
                         else "no checkpoint: starting at step 0")
            if env.get(C.CONTROL_URL_ENV) and env.get(C.CONTROL_TOKEN_ENV):
                try:
                    program.client = self.client_lib.SuspendClient.from_env(
                        env, clock=self.sim.now, state_dir=self.state_dir, attempts=1,
                        report_in_background=False)  # the simulation's one thread
                except (RuntimeError, ValueError) as error:
                    lines.append(f"no suspend channel: {error}")
        self._write(program, lines)
        return program

    def _total_steps(self, env: dict[str, str]) -> int:
        """The job's ``PLAYGROUND_RUN_MINUTES`` in steps, else the playground's run length."""
        try:
            minutes = float(env.get(RUN_MINUTES_ENV, ""))
        except ValueError:
            return self.total_steps
        if not 1 / 60 <= minutes <= 7 * 24 * 60:
            return self.total_steps
        return max(1, round(minutes * 60 / self.step_seconds))

    def run_of(self, program: _RankProgram) -> _AttemptRun:
        return self.runs[(program.job_id, program.attempt)]

    def step_of(self, program: _RankProgram) -> int:
        run = self.run_of(program)
        done = int((self.sim.now() - run.started_at) // self.step_seconds)
        return min(run.total_steps, run.first_step + max(0, done))

    def _preflight_done(self, task_arn: str) -> None:
        """The wrapper execs the training command: the attempt's steps count from now (the
        first of its ranks told so starts the clock for all)."""
        program = self.ranks.get(task_arn)
        if program is None or not program.held:
            return
        program.held = False
        run = self.run_of(program)
        if run.held:
            run.held = False
            run.started_at = self.sim.now()
            run.end_at = run.started_at + (run.total_steps - run.first_step) * self.step_seconds
        self.sim.plan_task(task_arn, max(0.0, run.end_at - self.sim.now()), exit_code=0)

    def _log_task(self, task_arn: str, lines: list[str]) -> None:
        program = self.ranks.get(task_arn)
        if program is not None:
            self._write(program, lines)

    def _step(self, program: _RankProgram, task: Any) -> None:
        if program.suspended or program.held:
            return  # go_suspend() does not return; the preflight holds the command back
        step, total = self.step_of(program), self.run_of(program).total_steps
        lines: list[str] = []
        if step // LOG_EVERY_STEPS > program.last_logged_step // LOG_EVERY_STEPS and step < total:
            lines.append(f"step {step}/{total} loss {self._loss(program.job_id, step):.4f}")
            program.last_logged_step = step
        if program.rank == 0:
            saved = self.checkpoints.get(program.job_id, 0)
            due = step - step % CHECKPOINT_EVERY_STEPS
            if due > saved and step < total:
                self.checkpoints[program.job_id] = due
                lines.append(f"checkpoint saved at step {due}")
                if program.client is not None:  # the stack's ledger measures lost work from it
                    program.client.checkpoint_saved(due)
            if program.client is not None:
                lines += self._suspend_check(program, task, step)
        self._write(program, lines)

    def _suspend_check(self, program: _RankProgram, task: Any, step: int) -> list[str]:
        if not program.client.receive_suspend_command():
            return []
        lines: list[str] = []
        if not program.told:
            program.told = True
            self.checkpoints[program.job_id] = max(step, self.checkpoints.get(program.job_id, 0))
            program.client.checkpoint_saved(step)
            state = program.client.read_state()
            lines.append(f"suspend command received ({state.get('reason') or 'suspend'}): checkpoint "
                         f"saved at step {step}; calling go_suspend()")
            self.note(self.sim.now(), task.node, f"rank 0 of job {program.job_id}: told to suspend; "
                                                 f"checkpoint at step {step}, go_suspend()")
        try:
            ack = program.client.go_suspend(block=False)
        except self.client_lib.ControlError as error:  # asked again at the next step
            return [*lines, f"go_suspend() failed ({error}); again at the next step"]
        program.suspended = True
        return [*lines, f"go_suspend(): job {ack.get('state')}, waiting to be stopped"]

    def _ended(self, program: _RankProgram, task: Any) -> None:
        program.ended = True
        code = task.exit_code
        cause = self.death_causes.pop(task.arn, "")
        if code == 0:
            total = self.run_of(program).total_steps
            lines = [f"step {total}/{total} done: training complete"]
        elif task.stop_code == "UserInitiated" or code == 143:
            lines = [f"SIGTERM received ({task.stopped_reason or 'StopTask'}): exiting"]
        elif code == 137 or code is None:
            lines = []  # the host went away with the process: nothing more is written
        else:
            lines = [cause or f"exiting with status {code}"]
        self._write(program, lines)

    @staticmethod
    def _loss(job_id: str, step: int) -> float:
        noise = (zlib.crc32(f"{job_id}:{step}".encode()) % 1000) / 1000 - 0.5
        return 0.35 + 2.9 * math.exp(-step / 400) + 0.03 * noise

    # ------------------------------------------------------------------ logs
    def _write(self, program: _RankProgram, lines: list[str]) -> None:
        if not lines:
            return
        logs = self.sim.local.client("logs")
        self._open_stream(program.log_group, program.log_stream)
        # Stamped on the simulated clock, which the emulator's Logs judges events' age on.
        stamp = int(self.sim.now() * 1000)
        logs.put_log_events(logGroupName=program.log_group, logStreamName=program.log_stream,
                            logEvents=[{"timestamp": stamp, "message": f"[rank {program.rank}] {line}"}
                                       for line in lines])

    def _open_stream(self, group: str, stream: str) -> None:
        if (group, stream) in self._logs_ready:
            return
        logs = self.sim.local.client("logs")
        with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
            logs.create_log_stream(logGroupName=group, logStreamName=stream)
        self._logs_ready.add((group, stream))

    def mark_crash(self, node: str, message: str, job_message: str | None = None) -> None:
        """What the ranks on ``node`` print when they die of the coming fault (and, with
        ``job_message``, what the other ranks of their jobs print: the NCCL cascade)."""
        jobs = set()
        for task in self.sim.running_tasks(node):
            if not task.health_check:
                self.death_causes[task.arn] = message
                jobs.add(task.tags.get(C.TAG_JOB_ID))
        if job_message:
            for task in self.sim.running_tasks():
                peer = task.tags.get(C.TAG_JOB_ID) in jobs - {None}
                if task.node != node and not task.health_check and peer:
                    self.death_causes.setdefault(task.arn, job_message)


def _stream_name(prefix: str, container: str, task_arn: str) -> str:
    """The awslogs driver's stream: ``prefix/container/task id``."""
    return f"{prefix}/{container}/{task_arn.rsplit('/', 1)[-1]}"
