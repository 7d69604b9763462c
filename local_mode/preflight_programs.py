"""The preflight wrapper of every simulated training program, in simulated time.

A queue rank whose command starts with the training client's wrapper
(``python gpu_recovery_client.py preflight -- ...``) runs, before its training, what the
shipped client runs: it asks the control API its step (``PreflightClient.step``, the real
client, over HTTP to the playground's local API or in process to the same handlers:
``server.InProcessOpener``) and runs each test it is given on the simulated fabric
(``sim.fabric``: the nodes' NVLink and network paths, with the faults injected there),
taking the time the fabric says; the output, all_reduce_perf's table as the tool prints
it, goes to the rank's log, and the test's reporter posts it (``PreflightClient.report``).

A group's all-reduce runs when its last member joined (as torchrun's rendezvous does) and
ends for all of them at once; a member that never joins, or a hung fabric, ends it at the
test's time limit with the failure the real runner reports ("timed out"). Told to train,
the program's training starts (``on_train``); told to stop, it waits to be stopped.

Used by the playground (``training_programs``), the preflight campaign and the bench.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C

logger = logging.getLogger(__name__)

WRAPPER_WORD = "preflight"  # gpu_recovery_client.py preflight -- <command>
POLL_FLOOR_SECONDS = 1.0
ERROR_RETRY_SECONDS = 5.0


#: (job id, rank, test, exit code, output) -> what the rank's program reports instead: a
#: tenant's image without all_reduce_perf, a forged table, a rank lying about its loopback.
Tamper = Callable[[str, int, dict[str, Any], int | None, str], tuple[int | None, str]]


def runs_wrapper(command: list[str]) -> bool:
    """Does a container command start with the preflight wrapper?"""
    head = command[: command.index("--")] if "--" in command else command[:4]
    return WRAPPER_WORD in head and any("gpu_recovery_client" in part for part in head)


@dataclass
class _Rank:
    task_arn: str
    job_id: str
    rank: int
    attempt: int
    node: str
    client: Any
    done: set[tuple[int, str]] = field(default_factory=set)
    unsent: dict[tuple[int, str], tuple[int | None, str, float]] = field(default_factory=dict)
    busy: bool = False  # in a test
    ended: str = ""  # train | stop


@dataclass
class _Group:
    members: set[int]
    joined: dict[int, float] = field(default_factory=dict)  # rank -> when it joined
    tests: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its own instruction
    started: bool = False


class PreflightPrograms:
    """Every wrapped rank's preflight (see the module docstring)."""

    def __init__(self, sim: Any, client_lib: Any, *, opener: Any = None,
                 log: Callable[[str, list[str]], None] | None = None,
                 on_train: Callable[[str], None] | None = None, tamper: Tamper | None = None) -> None:
        self.sim = sim
        self.tamper = tamper  # what a tenant's own program makes of a test (campaigns: issue 49)
        self.client_lib = client_lib
        self.opener = opener  # None: each client's own (HTTP to its GPU_RECOVERY_CONTROL_URL)
        self.log = log  # (task arn, lines): the rank's log stream
        self.on_train = on_train  # (task arn): its training starts now
        self.ranks: dict[str, _Rank] = {}
        self.groups: dict[tuple[str, int, int, str, int], _Group] = {}
        self.errors: list[str] = []

    # ------------------------------------------------------------------ starting
    def attach(self, task: Any, env: dict[str, str]) -> bool:
        """Take ``task`` over if its command runs the wrapper; True: its training waits."""
        if task.arn in self.ranks:
            return True
        override = (task.overrides.get("containerOverrides") or [{}])[0]
        if not runs_wrapper([str(c) for c in override.get("command") or []]):
            return False
        try:
            # The client's own retries of a failed call (seconds apart: here within the instant).
            client = self.client_lib.PreflightClient.from_env(env, opener=self.opener, sleep=lambda _s: None)
        except (RuntimeError, ValueError) as error:  # not a queue rank: the wrapper execs the command
            self._write(task.arn, [f"gpu_recovery_client: no preflight: {error}"])
            return False
        tags = task.tags
        rank = _Rank(task.arn, tags[C.TAG_JOB_ID], int(tags.get(C.TAG_RANK, "0")),
                     int(tags.get(C.TAG_ATTEMPT, "1")), task.node, client)
        self.ranks[task.arn] = rank
        self.sim.schedule(self.sim.now(), lambda: self._poll(rank),
                          f"preflight step {rank.job_id}/{rank.rank}")
        return True

    def watch(self, every_seconds: float, train_seconds: Callable[[Any], float | None]) -> None:
        """Without a training program around the ranks (the campaigns, the bench): find the
        wrapped ranks every ``every_seconds``; each task is held while its preflight runs,
        then runs ``train_seconds(task)`` and exits 0 (as the exec'd command would)."""

        def release(task_arn: str) -> None:
            task = self.sim.tasks.get(task_arn)
            if task is not None and not task.done:
                self.sim.plan_task(task_arn, train_seconds(task), exit_code=0)

        self.on_train = release
        seen: set[str] = set()

        def tick() -> None:
            for task in self.sim.running_tasks():
                if task.arn in seen or task.health_check or task.last_status != "RUNNING" \
                        or C.TAG_JOB_ID not in task.tags:
                    continue
                seen.add(task.arn)
                if self.attach(task, task.environment()):
                    self.sim.plan_task(task.arn, None)
            self.sim.schedule(self.sim.now() + every_seconds, tick, "preflight programs")

        self.sim.schedule(self.sim.now(), tick, "preflight programs")

    # ------------------------------------------------------------------ the step
    def _alive(self, rank: _Rank) -> bool:
        task = self.sim.tasks.get(rank.task_arn)
        return task is not None and not task.done and task.last_status == "RUNNING"

    def _poll(self, rank: _Rank) -> None:
        if rank.ended or rank.busy or not self._alive(rank):
            return
        try:
            step = rank.client.step()
        except Exception as error:  # the client's own retry: its next poll
            self.errors.append(f"{rank.job_id}/{rank.rank}: {error}")
            self._again(rank, ERROR_RETRY_SECONDS)
            return
        self._act(rank, step)

    def _again(self, rank: _Rank, seconds: float) -> None:
        self.sim.schedule(self.sim.now() + max(POLL_FLOOR_SECONDS, seconds), lambda: self._poll(rank),
                          f"preflight step {rank.job_id}/{rank.rank}")

    def _act(self, rank: _Rank, step: dict[str, Any]) -> None:
        action = str(step.get("action") or "")
        if action in ("skip", "train"):
            rank.ended = "train"
            self._write(rank.task_arn, [f"gpu_recovery_client: preflight {step.get('status') or action}: "
                                        f"{step.get('reason') or ''}".rstrip(": ")])
            if self.on_train is not None:
                self.on_train(rank.task_arn)
            return
        if action == "stop":
            rank.ended = "stop"
            self._write(rank.task_arn, [f"gpu_recovery_client: preflight: {step.get('reason') or 'stop'}; "
                                        "waiting to be stopped"])
            return
        round_ = int(step.get("round") or 0)
        if action == "run":  # a result whose report failed is sent again while its round runs
            for key in sorted(rank.unsent):
                if key[0] == round_:
                    self._send(rank, key)
                else:
                    del rank.unsent[key]
        todo = [t for t in step.get("tests") or () if (round_, str(t.get("id"))) not in rank.done] \
            if action == "run" else []
        if todo:
            self._run(rank, round_, todo)
            return
        self._again(rank, float(step.get("poll_seconds") or 2))

    # ------------------------------------------------------------------ a test
    def _run(self, rank: _Rank, round_: int, tests: list[dict[str, Any]]) -> None:
        """The first test not run yet (round 1: the loopback, then the gang)."""
        test = tests[0]
        rank.busy = True
        # A group is its test in its round (each node's loopback is a group of its own).
        key = (rank.job_id, rank.attempt, round_, str(test["id"]), int(test.get("leader") or 0))
        members = {r for lo, hi in test.get("members") or [[rank.rank, rank.rank + 1]] for r in range(lo, hi)}
        group = self.groups.setdefault(key, _Group(members))
        group.joined.setdefault(rank.rank, self.sim.now())
        group.tests[rank.rank] = test
        limit = self.sim.now() + float(test.get("timeout_seconds") or 120)
        self.sim.schedule(limit, lambda: self._time_limit(rank, round_, test), "preflight time limit")
        if set(group.joined) >= group.members and not group.started:
            group.started = True
            self._start_group(key, round_, test, group)

    def _start_group(self, key: tuple[str, int, int, str, int], round_: int, test: dict[str, Any],
                     group: _Group) -> None:
        job_id, attempt = key[0], key[1]
        by_rank = {r.rank: r for r in self.ranks.values() if r.job_id == job_id and r.attempt == attempt}
        nodes = [by_rank[m].node for m in sorted(group.members) if m in by_rank]
        gpus = max(1, len(self.sim.nodes[nodes[0]].gpu_ids)) if nodes else 8
        run = self.sim.fabric.run(nodes, gpus, int(test["min_bytes"]), int(test["max_bytes"]))
        if run.hung:
            return  # every member's time limit ends it
        at = self.sim.now() + run.seconds
        for member in sorted(group.members):
            rank = by_rank.get(member)
            mine = group.tests.get(member)
            if rank is not None and mine is not None:
                self.sim.schedule(
                    at, lambda r=rank, t=mine: self._finished(r, round_, t, 0, run.output, run.seconds),
                    "preflight test done")

    def _time_limit(self, rank: _Rank, round_: int, test: dict[str, Any]) -> None:
        if (round_, str(test["id"])) in rank.done:
            return
        seconds = float(test.get("timeout_seconds") or 120)
        self._finished(rank, round_, test, None, f"Test failure: timed out after {seconds:.0f} s\n", seconds)

    def _finished(self, rank: _Rank, round_: int, test: dict[str, Any], exit_code: int | None, output: str,
                  seconds: float) -> None:
        key = (round_, str(test["id"]))
        if key in rank.done:
            return
        if self.tamper is not None:
            exit_code, output = self.tamper(rank.job_id, rank.rank, test, exit_code, output)
        rank.done.add(key)
        rank.busy = False
        if not self._alive(rank):
            return
        reporter = bool(test.get("report"))
        lines = output.splitlines() if (reporter or test.get("kind") == "loopback") else \
            [f"preflight round {round_} test {test['id']}: done (rank {test.get('leader')} reports it)"]
        head = (f"gpu_recovery_client: preflight round {round_} test {test['id']} "
                f"({test.get('group_size')} node(s)): exit {exit_code} in {seconds:.1f} s")
        self._write(rank.task_arn, [head, *lines])
        if reporter:
            rank.unsent[key] = (exit_code, output, seconds)
            answer = self._send(rank, key)
            if answer is None:
                self._again(rank, ERROR_RETRY_SECONDS)
            else:
                self._act(rank, answer)
            return
        self._poll(rank)

    def _send(self, rank: _Rank, key: tuple[int, str]) -> dict[str, Any] | None:
        """The client's send of a result (``send_report``): kept in ``rank.unsent`` while it fails."""
        address = f"10.0.0.{rank.rank % 250 + 1}"
        return self.client_lib.send_report(  # type: ignore[no-any-return]
            rank.client, key, rank.unsent, address,
            lambda message: self.errors.append(f"{rank.job_id}/{rank.rank}: {message}"))

    def _write(self, task_arn: str, lines: list[str]) -> None:
        if self.log is not None and lines:
            self.log(task_arn, lines)

