"""Time-sharing scenario of ``make demo``: quotas, a preemption with a graceful suspend, a resume.

Its own simulated cluster (moto + simulated ECS, four 8-GPU nodes, AWS-shaped events
delivered at least once, the recovery sweep and the queue scheduler every minute), the
local REST API served over HTTP on 127.0.0.1, and the scheduler given
``JOB_CONTROL_API_URL`` = that API, so the launcher hands every rank its suspend channel:

1. an admin (``JOBS_ADMIN_ROLES``) sets node quotas with ``PUT /v1/quotas``: alice may
   hold 4 nodes at LOW, bob 2 at HIGH;
2. alice's LOW 4-node ``alice-pretrain`` fills the cluster. Its rank 0 is a program of the
   simulation that, every 2 simulated seconds while its task runs, calls the REAL
   training client (``training_client/gpu_recovery_client.py``: ``SuspendClient`` built
   from the rank's own container environment, the simulation's clock) over HTTP;
3. bob submits ``bob-finetune`` with priority AUTO: it resolves to HIGH (his only level
   with quota room), cannot be placed, and the scheduler preempts alice's job;
4. rank 0's ``receive_suspend_command()`` turns True within one poll; it saves a checkpoint
   (its step) and calls ``go_suspend(block=False)``: every rank is stopped, the job is
   SUSPENDED and queued again at its original position;
5. bob's job runs. His second HIGH job ``bob-sweep`` (1 node) waits on his quota
   (``wait_reason: quota: ...``) although two nodes are free, and starts once
   ``bob-finetune`` ended;
6. alice's job resumes (attempt 2, ``RESUME_COUNT=1``), continues from its checkpoint (runs
   only the steps left) and completes; every user's quota usage is back to zero.

At every scheduler tick (the only place nodes are taken) the scenario counts the nodes
each user holds per level from the simulated ECS tasks and checks them against the
quotas the admin set. ``run()`` returns a :class:`TimeSharingResult`: its ``problems``
are empty when everything happened as described; it carries the two latencies
(decision -> rank 0 informed, decision -> GPUs free). ``bench/time_sharing_bench.py``
runs the same world trimmed (``until="suspended"``) at several phases of the poll.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpu_recovery import constants as C
from local_mode.scripts import load_client_library
from local_mode.world import World, build_world

MIN = 60
NODES = ("node-1", "node-2", "node-3", "node-4")
ADMIN, ALICE, BOB = "admin", "alice", "bob"
QUOTAS = {(ALICE, "LOW"): 4, (BOB, "HIGH"): 2}
STEP_SECONDS = 2.0  # the rank-0 program's training step: it asks the client once per step
PRETRAIN_STEPS = 180  # 6 simulated minutes of work at one step per 2 s
GRACE_SECONDS = 60
FINETUNE_SECONDS = 5 * MIN
SWEEP_SECONDS = 2 * MIN
PRETRAIN_AT = 5.0  # seconds after the start
FINETUNE_AT = 3 * MIN + 30  # + the phase: bob's submit (the preemption decision)
SWEEP_AT = 4 * MIN + 30
RUN_LIMIT_SECONDS = 2 * 60 * MIN
TERMINAL = ("COMPLETE", "FAILED", "CANCELED", "USER_STOPPED")
_NOTE_ORDER = itertools.count()


def note_order(sim: Any) -> tuple[int, int, int]:
    """Orders a note after the simulator events logged before it and before those after
    (a simulator event ``i`` sorts as ``(i, 1, 0)``)."""
    return (len(sim.timeline), 0, next(_NOTE_ORDER))


def stamp(t: float) -> str:
    """``14:05:31.7``: the latencies are shorter than a second's rounding matters."""
    return datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M:%S") + f".{int(t * 10) % 10}"


@dataclass
class TimeSharingResult:
    problems: list[str]
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> job item
    informed_seconds: float | None = None  # preemption decision -> rank 0's first True
    stop_issued_seconds: float | None = None  # decision -> first StopTask of the victim
    gpus_free_seconds: float | None = None  # decision -> every rank of the victim STOPPED
    facts: dict[str, Any] = field(default_factory=dict)
    timeline: list[str] = field(default_factory=list)
    simulated_minutes: float = 0.0
    wall_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


class Rank0Program:
    """alice-pretrain's training program as the simulation runs it: one step every
    ``STEP_SECONDS`` while rank 0's task runs. Each step asks the real client
    ``receive_suspend_command()``; told, it saves a checkpoint (its step) and calls
    ``go_suspend(block=False)`` (``respond=False``: it never does, and is stopped by force
    when its grace is over). A resumed attempt (``RESUME_COUNT`` >= 1) starts from the
    checkpoint, so its ranks run only the steps left."""

    def __init__(self, sim: Any, client_lib: Any, state_dir: str, total_steps: int, *,
                 respond: bool = True) -> None:
        self.sim = sim
        self.lib = client_lib
        self.state_dir = state_dir
        self.total_steps = total_steps
        self.respond = respond
        self.job_id = ""
        self.notes: list[tuple[float, tuple[int, int, int], str, str]] = []  # (time, order, node, text)
        self.checkpoint: int | None = None
        self.checkpoints = 0
        self.told_at: dict[int, float] = {}  # attempt -> sim time of the first True
        self.suspend_acks: dict[int, dict[str, Any]] = {}
        self.resume_counts: dict[int, str] = {}  # attempt -> RESUME_COUNT its ranks got
        self.started_from: dict[int, int] = {}  # attempt -> first step
        self.polls = 0
        self.errors: list[str] = []
        self.finished = False
        self._task = ""
        self._attempt = 0
        self._first_step = 0
        self._client: Any = None

    def start(self, at: float) -> None:
        self.sim.schedule(at, self._step, "rank 0 step")

    def note(self, node: str, text: str) -> None:
        self.notes.append((self.sim.now(), note_order(self.sim), node, text))

    def _rank0_task(self) -> Any:
        for task in self.sim.running_tasks():
            if (task.tags.get(C.TAG_JOB_ID) == self.job_id and task.tags.get(C.TAG_RANK) == "0"
                    and task.last_status == "RUNNING" and task.desired_status == "RUNNING"):
                return task
        return None

    def _step(self) -> None:
        if self.finished:
            return
        task = self._rank0_task() if self.job_id else None
        if task is not None:
            if task.arn != self._task:
                self._attach(task)
            self._train(task)
        self.sim.schedule(self.sim.now() + STEP_SECONDS, self._step, "rank 0 step")

    @staticmethod
    def environment(task: Any) -> dict[str, str]:
        """The container's environment: what ECS gives the process (the launcher's overrides)."""
        [override] = task.overrides["containerOverrides"]
        return {e["name"]: e["value"] for e in override.get("environment") or []}

    def _attach(self, task: Any) -> None:
        """A new attempt's rank 0 started: its client, its checkpoint, its ranks' length."""
        env = self.environment(task)
        self._task = task.arn
        self._attempt = int(env.get("ATTEMPT") or 0)
        resume_count = env.get(C.RESUME_COUNT_ENV, "")
        self.resume_counts[self._attempt] = resume_count
        # go_suspend() retries a transient failure with real sleeps; in simulated time the
        # program asks again at its next step instead (attempts=1).
        self._client = self.lib.SuspendClient.from_env(env, clock=self.sim.now, state_dir=self.state_dir,
                                                       attempts=1)
        resumed = resume_count not in ("", "0") and self.checkpoint is not None
        self._first_step = self.checkpoint if resumed and self.checkpoint is not None else 0
        self.started_from[self._attempt] = self._first_step
        left = self.total_steps - self._first_step
        # Every rank loads the same checkpoint and runs the steps left, then exits 0.
        for rank_task in self.sim.running_tasks():
            if (rank_task.tags.get(C.TAG_JOB_ID) == self.job_id
                    and rank_task.tags.get(C.TAG_ATTEMPT) == str(self._attempt)):
                started = rank_task.started_at or self.sim.now()
                self.sim.plan_task(rank_task.arn, max(0.0, started + left * STEP_SECONDS - self.sim.now()))
        where = (f"resuming from the checkpoint at step {self._first_step}" if resumed
                 else "no checkpoint: starting at step 0")
        self.note(task.node, f"rank 0 (attempt {self._attempt}, {C.RESUME_COUNT_ENV}={resume_count}): "
                             f"SuspendClient.from_env(): {C.CONTROL_URL_ENV}={env.get(C.CONTROL_URL_ENV)}, "
                             f"its own token (rank {self._client.rank}); {where}; {left} steps to go")

    def step_now(self, task: Any) -> int:
        started = task.started_at or self.sim.now()
        return self._first_step + int((self.sim.now() - started) // STEP_SECONDS)

    def _train(self, task: Any) -> None:
        attempt = self._attempt
        if attempt in self.suspend_acks:
            return  # go_suspend() does not return: the process waits to be stopped
        told_before = attempt in self.told_at
        self.polls += 1
        if not self._client.receive_suspend_command():
            return
        step = self.step_now(task)
        if not told_before:
            self.told_at[attempt] = self.sim.now()
            state = self._client.read_state()  # what the API answered (shared by the container)
            grace = float(state.get("grace_seconds") or 0)
            decided = float(state.get("deadline_at") or 0) - grace
            self.note(task.node, f"rank 0: receive_suspend_command() -> True at step {step}, "
                                 f"{self.sim.now() - decided:.1f} s after the decision (grace {grace:.0f} s: "
                                 f"{state.get('reason')})")
            if not self.respond:
                self.note(task.node, "rank 0: this program ignores it (no checkpoint, no go_suspend())")
                return
            self.checkpoint = step
            self.checkpoints += 1
            self.note(task.node, f"rank 0: checkpoint saved at step {step} of {self.total_steps}")
        if not self.respond:
            return
        try:
            ack = self._client.go_suspend(block=False)
        except self.lib.ControlError as error:  # asked again at the next step
            self.errors.append(str(error))
            self.note(task.node, f"rank 0: go_suspend() failed ({error}); again at the next step")
            return
        self.suspend_acks[attempt] = ack
        self.note(task.node, f"rank 0: go_suspend() -> job {ack.get('state')}, ranks "
                             f"{sorted(ack.get('stopping_ranks') or [])} being stopped")

    def ranks_done(self) -> None:
        """Called once the job completed: the program ends."""
        self.finished = True


class _Run:
    """One run: the world it runs in, the local API and its users' clients, and what the run
    noted and counted (the quotas held, the API's and the scheduler's failures)."""

    def __init__(self, world: World, server: Any, clients: dict[str, Any]) -> None:
        self.world = world
        self.server = server
        self.clients = clients
        # (time, order, label, node, text)
        self.notes: list[tuple[float, tuple[int, int, int], str, str, str]] = []
        self.job_ids: dict[str, str] = {}  # name -> job id
        self.charged: dict[str, tuple[str, str]] = {}  # job id -> (user, level name)
        self.quota_checks = 0
        self.quota_violations: list[str] = []
        self.max_held: dict[tuple[str, str], int] = {}
        self.api_errors: list[str] = []
        self.tick_failures: list[str] = []

    def note(self, label: str, text: str, node: str = "api") -> None:
        self.notes.append((self.world.ecs.now(), note_order(self.world.ecs), label, node, text))

    def job(self, name: str) -> dict[str, Any]:
        return self.world.job(self.job_ids[name])

    def free_nodes(self) -> int:
        return sum(1 for n in self.world.ecs.nodes.values() if len(n.free_gpu_ids) == len(n.gpu_ids))

    # ----------------------------------------------------------------- quotas
    def check_quotas(self) -> None:
        """Nodes each user holds per level (one per live rank task), against the quotas."""
        held: dict[tuple[str, str], int] = {}
        for task in self.world.ecs.running_tasks():
            owner = self.charged.get(task.tags.get(C.TAG_JOB_ID, ""))
            if owner is not None and not task.health_check:
                held[owner] = held.get(owner, 0) + 1
        self.quota_checks += 1
        for key, nodes in held.items():
            self.max_held[key] = max(self.max_held.get(key, 0), nodes)
            limit = QUOTAS.get(key)
            if limit is not None and nodes > limit:
                self.quota_violations.append(f"{stamp(self.world.ecs.now())}: {key[0]} holds {nodes} "
                                             f"node(s) at {key[1]} (quota {limit})")

    def scheduler_target(self, handler: Any) -> Any:
        def tick(event: dict[str, Any], context: Any) -> Any:
            try:
                return handler(event, context)
            finally:
                self.check_quotas()
        return tick

    # -------------------------------------------------------------- the API
    def set_quota(self, user: str, level: str, nodes: int) -> None:
        row = self.clients[ADMIN].request("PUT", "/quotas", body={"user": user, "priority": level,
                                                                   "max_nodes": nodes})
        self.note("admin", f"PUT /v1/quotas {{user: {user}, priority: {level}, max_nodes: {nodes}}} -> "
                           f"{row.get('user')} {row.get('priority_name')}: {row.get('max_nodes')} node(s)")

    def submit(self, user: str, name: str, td: str, nnodes: int, priority: str, **extra: Any) -> str:
        spec = {"name": name, "task_definition": td, "nnodes": nnodes, "gpus_per_node": 8,
                "priority": priority, "max_recovery_attempts": 1, **extra}
        try:
            created = self.clients[user].submit(spec, idempotency_key=f"time-sharing-{name}")
        except Exception as error:  # shown and counted as a problem
            self.api_errors.append(f"submit {name}: {error}")
            return ""
        job_id = str(created["job_id"])
        self.job_ids[name] = job_id
        view = self.clients[user].get_job(job_id)
        self.charged[job_id] = (user, str(view.get("priority_name")))
        asked = f"{priority} -> {view.get('priority_name')}" if priority == "AUTO" else priority
        waiting = f", wait_reason: {view['wait_reason']}" if view.get("wait_reason") else ""
        self.note(name, f"{user}: POST /v1/jobs {name} ({nnodes}x8 GPUs, priority {asked}) -> 201; "
                        f"after the scheduler run it triggered: {view.get('state')}{waiting}")
        return job_id

    def show_wait(self, name: str, user: str) -> dict[str, Any]:
        view: dict[str, Any] = self.clients[user].get_job(self.job_ids[name])
        self.note(name, f"{user}: GET /v1/jobs/{name} -> {view.get('state')}, wait_reason: "
                        f"{view.get('wait_reason')!r}; {self.free_nodes()} node(s) free")
        return view


@contextlib.contextmanager
def _world(*, duplicate_delivery: bool) -> Iterator[_Run]:
    from cli.gpujobs import ApiClient
    from handlers import queue_scheduler
    from local_mode.harness import loopback_without_proxy, reset_handler_caches, silence_handler_logs
    from local_mode.server import LocalApi, LocalApiServer

    warnings.filterwarnings("ignore")
    with contextlib.ExitStack() as stack:
        stack.enter_context(loopback_without_proxy())
        # Before the emulator (it resets the boto3 session) and after it: the handlers'
        # cached services must be built on the emulator's hooked session.
        reset_handler_caches()
        stack.callback(reset_handler_caches)
        # The API first: its URL is the scheduler's JOB_CONTROL_API_URL (the launcher gives
        # it to every rank). It calls the handlers only once a request arrives.
        server = stack.enter_context(LocalApiServer(LocalApi()))
        world = stack.enter_context(build_world(
            duplicate_delivery=duplicate_delivery, sweep_every_seconds=60, max_recovery_attempts=1,
            extra_env={"POWERTOOLS_LOG_LEVEL": "CRITICAL", C.ENV_JOBS_ADMIN_ROLES: ADMIN,
                       # The deployed stage URL carries the stage; the local API accepts it.
                       C.ENV_CONTROL_API_URL: f"{server.url}/prod"}))
        silence_handler_logs()
        for name in ("job-control-api", "job-control-authorizer", "gpu_recovery_client"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        clients = {user: ApiClient(server.url, local_user=user, timeout=30) for user in (ADMIN, ALICE, BOB)}
        scenario = _Run(world, server, clients)
        world.schedule_queue_scheduler(60, target=scenario.scheduler_target(queue_scheduler.lambda_handler))
        world.invoke_scheduler_in_process(
            lambda error: scenario.tick_failures.append(f"{type(error).__name__}: {error}"),
            target=scenario.scheduler_target(queue_scheduler.lambda_handler))
        for node in NODES:
            world.ecs.add_node(node, gpus=8)
        yield scenario


def run(*, duplicate_delivery: bool = True, phase: float = 0.7, respond: bool = True,
        grace_seconds: int = GRACE_SECONDS, until: str = "complete",
        finetune_at: float = FINETUNE_AT) -> TimeSharingResult:
    """The scenario. ``phase``: where bob's submit (the decision) falls in rank 0's 2 s
    step; ``respond=False``: rank 0 never calls go_suspend() (forced after the grace);
    ``until="suspended"``: stop once alice's job is SUSPENDED (the benchmark's runs)."""
    if until not in ("complete", "suspended"):
        raise ValueError("until is 'complete' or 'suspended'")
    started = time.perf_counter()
    lib = load_client_library()
    with tempfile.TemporaryDirectory(prefix="time-sharing-rank0-") as state_dir, \
            _world(duplicate_delivery=duplicate_delivery) as w:
        sim = w.world.ecs
        t0 = sim.now()
        tds = {}
        for family, seconds in (("alice-pretrain", None), ("bob-finetune", FINETUNE_SECONDS),
                                ("bob-sweep", SWEEP_SECONDS)):
            tds[family] = sim.register_training_task_definition(family, gpus=8)
            # alice's ranks run until her program says its steps are done (plan_task).
            sim.plan_family(family, run_seconds=seconds, exit_code=0)
        program = Rank0Program(sim, lib, state_dir, PRETRAIN_STEPS, respond=respond)
        program.start(t0)
        for (user, level), nodes in QUOTAS.items():
            w.set_quota(user, level, nodes)

        def alice_submits() -> None:
            program.job_id = w.submit(ALICE, "alice-pretrain", tds["alice-pretrain"], 4, "LOW",
                                      suspend_grace_seconds=grace_seconds)

        # A scheduled action returns the ECS events it emits: these emit none (returning the
        # job id or the job's view would put each of its characters or keys on the bus).
        def bob_submits() -> None:
            w.submit(BOB, "bob-finetune", tds["bob-finetune"], 2, "AUTO")

        def bob_submits_a_sweep() -> None:
            w.submit(BOB, "bob-sweep", tds["bob-sweep"], 1, "HIGH")

        def looks(name: str, user: str) -> Callable[[], None]:
            def look() -> None:
                w.show_wait(name, user)

            return look

        sim.schedule(t0 + PRETRAIN_AT, alice_submits, "alice submits")
        sim.schedule(t0 + finetune_at + phase, bob_submits, "bob submits")
        if until == "complete":
            sim.schedule(t0 + SWEEP_AT, bob_submits_a_sweep, "bob submits a second job")
            sim.schedule(t0 + SWEEP_AT + 20, looks("bob-sweep", BOB), "bob looks")
            sim.schedule(t0 + SWEEP_AT + 22, looks("alice-pretrain", ALICE), "alice looks")

        checked = [0.0]

        def ended() -> bool:  # read the jobs at most every 10 simulated seconds
            if sim.now() < checked[0] + 10:
                return False
            checked[0] = sim.now()
            if until == "suspended":
                return bool(w.job_ids.get("alice-pretrain")) and \
                    w.job("alice-pretrain").get("job_state") == "SUSPENDED"
            names = ("alice-pretrain", "bob-finetune", "bob-sweep")
            return all(n in w.job_ids for n in names) and \
                all(w.job(n).get("job_state") in TERMINAL for n in names)

        sim.run_until_true(ended, max_seconds=RUN_LIMIT_SECONDS)
        program.ranks_done()
        if until == "complete":
            sim.run_for(MIN + 5)  # the next tick releases the last quota charges
        result = _result(w, program, t0, until=until, respond=respond, grace_seconds=grace_seconds)
    result.wall_seconds = time.perf_counter() - started
    return result


def _result(w: _Run, program: Rank0Program, t0: float, *, until: str, respond: bool,
            grace_seconds: int) -> TimeSharingResult:
    sim = w.world.ecs
    jobs = {name: w.job(name) for name in w.job_ids}
    result = TimeSharingResult(problems=[], jobs=jobs, simulated_minutes=(sim.now() - t0) / 60)
    problems = result.problems
    problems += w.api_errors + w.tick_failures + [f"quota exceeded: {v}" for v in w.quota_violations]
    if w.world.bus.dead_letters:
        problems.append(f"{len(w.world.bus.dead_letters)} event(s) in a DLQ")
    pretrain = jobs.get("alice-pretrain", {})
    alice_id = w.job_ids.get("alice-pretrain", "")
    history = pretrain.get("history") or []
    decided = next((float(h["at"]) for h in history if h.get("to") == "SUSPENDING"), None)
    first = [t for t in sim.tasks.values() if t.tags.get(C.TAG_JOB_ID) == alice_id
             and t.tags.get(C.TAG_ATTEMPT) == "1" and not t.health_check]
    told = program.told_at.get(1)
    if decided is None:
        problems.append("alice's job was never asked to suspend")
    else:
        if told is None:
            problems.append("rank 0 was never told to suspend")
        else:
            result.informed_seconds = round(told - decided, 3)
            if result.informed_seconds > 5:
                problems.append(f"rank 0 told {result.informed_seconds} s after the decision (want <= 5)")
        if first and all(t.stopped_at is not None for t in first):
            result.gpus_free_seconds = round(max(float(t.stopped_at or 0) for t in first) - decided, 3)
            result.stop_issued_seconds = round(min(float(t.stopping_at or 0) for t in first) - decided, 3)
        else:
            problems.append("alice's first attempt never stopped")
    reasons = " | ".join(str(h.get("reason")) for h in history)
    forced = "stopped by force" in reasons
    result.facts.update(
        decision_at=decided, told_at=told, forced=forced, grace_seconds=grace_seconds,
        checkpoints=program.checkpoints, checkpoint_step=program.checkpoint,
        resume_counts=dict(program.resume_counts), started_from=dict(program.started_from),
        polls=program.polls, client_errors=list(program.errors), quota_checks=w.quota_checks,
        max_held={f"{u} {lvl}": n for (u, lvl), n in sorted(w.max_held.items())},
        quota_never_exceeded=not w.quota_violations and w.quota_checks > 0,
        deadline_at=(decided + grace_seconds) if decided is not None else None,
    )
    if respond and forced:
        problems.append("alice's job was stopped by force, not through go_suspend()")
    if respond and "called go_suspend()" not in reasons:
        problems.append("no go_suspend() in alice's history")
    if not respond and not forced:
        problems.append("a rank 0 that never calls go_suspend() was not stopped by force")
    if until == "complete":
        _check_complete(w, program, result)
    result.timeline = _timeline(w, program, jobs)
    return result


def _check_complete(w: _Run, program: Rank0Program, result: TimeSharingResult) -> None:
    problems, jobs = result.problems, result.jobs
    for name in ("alice-pretrain", "bob-finetune", "bob-sweep"):
        job = jobs.get(name, {})
        if job.get("job_state") != "COMPLETE":
            problems.append(f"{name} {job.get('job_state')}: {str(job.get('last_error'))[:200]}")
        if int(job.get("recoveries_used") or 0):
            problems.append(f"{name} spent {job.get('recoveries_used')} recoveries")
    pretrain = jobs.get("alice-pretrain", {})
    counts = (int(pretrain.get("suspend_count") or 0), int(pretrain.get("resume_count") or 0),
              int(pretrain.get("attempt") or 0))
    if counts != (1, 1, 2):
        problems.append(f"alice-pretrain suspended/resumed/attempt {counts} (want (1, 1, 2))")
    if program.checkpoints != 1:
        problems.append(f"rank 0 saved {program.checkpoints} checkpoint(s) (want 1)")
    if program.resume_counts != {1: "0", 2: "1"}:
        problems.append(f"RESUME_COUNT per attempt {program.resume_counts} (want {{1: '0', 2: '1'}})")
    if program.started_from.get(2) != program.checkpoint:
        problems.append(f"attempt 2 started at step {program.started_from.get(2)}, "
                        f"not at the checkpoint ({program.checkpoint})")
    # The resumed attempt ran only what was left (the ranks' RUNNING -> exit time).
    alice_id = w.job_ids.get("alice-pretrain", "")
    second = [t for t in w.world.ecs.tasks.values() if t.tags.get(C.TAG_JOB_ID) == alice_id
              and t.tags.get(C.TAG_ATTEMPT) == "2" and not t.health_check]
    if program.checkpoint is not None and second:
        ran = max(float(t.stopped_at or 0) - float(t.started_at or 0) for t in second)
        left = (PRETRAIN_STEPS - program.checkpoint) * STEP_SECONDS
        result.facts["resumed_ran_seconds"] = round(ran, 1)
        result.facts["steps_left_seconds"] = left
        if abs(ran - left) > STEP_SECONDS:
            problems.append(f"the resumed attempt ran {ran:.0f} s for {left:.0f} s of steps left")
    finetune = jobs.get("bob-finetune", {})
    if int(finetune.get("priority", -1)) != 30 or finetune.get("priority_requested") != "AUTO":
        problems.append(f"bob-finetune: priority {finetune.get('priority')} "
                        f"({finetune.get('priority_requested')}), want HIGH from AUTO")
    quota_wait = next((text for _, _, label, _, text in w.notes
                       if label == "bob-sweep" and "wait_reason: 'quota:" in text), "")
    result.facts["quota_wait"] = quota_wait
    if not quota_wait or "0 node(s) free" in quota_wait:
        problems.append(f"bob-sweep did not wait on its quota with nodes free: {quota_wait!r}")
    sweep = jobs.get("bob-sweep", {})
    sweep_runs = [float(h["at"]) for h in sweep.get("history") or [] if h.get("to") == "RUNNING"]
    finetune_end = [float(h["at"]) for h in finetune.get("history") or [] if h.get("to") == "COMPLETE"]
    if sweep_runs and finetune_end and sweep_runs[0] < finetune_end[0]:
        problems.append("bob-sweep ran while bob-finetune held his HIGH quota")
    rows = w.clients[ADMIN].quotas(all_users=True).get("quotas", [])
    result.facts["quota_usage_at_end"] = {f"{r['user']} {r['priority_name']}": r["used_nodes"] for r in rows}
    if any(int(r.get("used_nodes") or 0) for r in rows):
        problems.append(f"quota usage left at the end: {result.facts['quota_usage_at_end']}")


def _timeline(w: _Run, program: Rank0Program, jobs: dict[str, dict[str, Any]]) -> list[str]:
    """The simulator's events, the API calls, the rank-0 program's lines and every job's
    history, in time order, each labelled with its job."""
    names = {job_id: name for name, job_id in w.job_ids.items()}

    def shorten(text: str) -> str:
        for job_id, name in names.items():
            text = text.replace(job_id, name)
        return text

    def label_of(text: str) -> str:
        return next((name for job_id, name in names.items() if job_id in text), "")

    entries: list[tuple[float, tuple[int, int, int], str]] = []

    def add(at: float, order: tuple[int, int, int], label: str, node: str, text: str) -> None:
        entries.append((at, order, f"{stamp(at)}  {label:<15} {node:<8}  {shorten(text)}"))

    for seq, entry in enumerate(w.world.ecs.timeline):
        node, text = entry.text[:8].strip(), entry.text[10:]
        if entry.kind == "node" or " placed (" in text or entry.kind == "schedule":
            continue  # registration and placement: the RUNNING lines say where
        add(entry.time, (seq, 1, 0), label_of(text), node, text)
    for at, order, label, node, text in w.notes:
        add(at, order, label, node, text)
    for at, order, node, text in program.notes:
        add(at, order, "alice-pretrain", node, text)
    for name, job in jobs.items():
        for entry in job.get("history") or []:
            add(float(entry.get("at", 0)), (10**9, 0, 0), name, "",
                f"job -> {entry.get('to')}: {entry.get('reason')}")
    entries.sort(key=lambda e: (e[0], e[1]))
    return [text for _, _, text in entries]


def report(result: TimeSharingResult) -> list[str]:
    """What ``make demo`` prints for the scenario."""
    facts = result.facts
    out = ["Time sharing: quotas, preemption with a graceful suspend, resume "
           "(local_mode/time_sharing_scenario.py)", "=" * 78,
           "4 nodes x 8 GPUs; quotas set by an admin over HTTP (PUT /v1/quotas); rank 0 of alice's job "
           "calls the real gpu_recovery_client every 2 simulated seconds over HTTP", ""]
    out += result.timeline
    out += ["", "Outcome", "-" * 78]
    for name, job in result.jobs.items():
        out.append(f"{name:<15} {job.get('job_state', '?'):<9} priority {job.get('priority')} attempt "
                   f"{job.get('attempt')} suspended {job.get('suspend_count', 0)} resumed "
                   f"{job.get('resume_count', 0)} recoveries {job.get('recoveries_used', 0)}")
    out.append(f"decision -> rank 0 informed: {result.informed_seconds} s (bound: 5 s; the client polls "
               f"every 2 s); -> StopTask: {result.stop_issued_seconds} s; -> GPUs free (every rank "
               f"STOPPED): {result.gpus_free_seconds} s (the simulated containers exit 10 s after SIGTERM)")
    out.append(f"checkpoint at step {facts.get('checkpoint_step')} of {PRETRAIN_STEPS}; the resumed attempt "
               f"ran {facts.get('resumed_ran_seconds')} s for {facts.get('steps_left_seconds')} s of steps "
               "left; "
               f"RESUME_COUNT per attempt {facts.get('resume_counts')}")
    out.append(f"quota never exceeded: {'yes' if facts.get('quota_never_exceeded') else 'NO'} (checked after "
               f"each of {facts.get('quota_checks')} scheduler runs; most held {facts.get('max_held')}); "
               f"usage at the end {facts.get('quota_usage_at_end')}")
    out.append(f"rank 0 asked receive_suspend_command() {facts.get('polls')} times")
    for problem in result.problems:
        out.append(f"!! {problem}")
    out.append(f"{'ok' if result.ok else '!!'} time sharing "
               f"{'as described' if result.ok else f'{len(result.problems)} problem(s)'} "
               f"(simulated {result.simulated_minutes:.0f} minutes in {result.wall_seconds:.1f} s wall)")
    return out


if __name__ == "__main__":
    outcome = run()
    print("\n".join(report(outcome)))
    sys.exit(0 if outcome.ok else 1)
