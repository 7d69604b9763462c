"""Fault campaigns for evidence from a tenant's program (issue 49): the gang preflight is the
tenant's word, so it may make nodes suspects for the stack's own check and nothing more.

Each flow runs queue jobs whose ranks run the training client's wrapper
(``local_mode.preflight_programs``: the shipped client, the real control-API handler, the
simulated fabric), with a tenant's program that says something else than the fabric did
(``PreflightPrograms.tamper``), broken at each of its AWS calls in turn:

* ``preflight_forged_baseline`` — a tenant's 2-node job posts ``all_reduce_perf`` tables with
  busbw x1000; it passes but teaches nothing (above the physical bound); another user's
  honest 2-node job, queued behind it on the same two nodes, then passes, pinned nothing,
  and is learned.
* ``preflight_forged_loopback`` — a 2-node job's rank 1 reports exit 1 for its loopback on a
  healthy node, at every attempt: the node gets the stack's DCGM check and is cleared, never
  rebooted; after ``cleared_limit`` (2) such faults an operator is told
  (``tenant_evidence_limited``) and the job's next preflight pins nothing: it completes.
* ``preflight_broken_image`` — a 2-node ``preflight: always`` job whose loopbacks fail alike on
  every node (an image without ``all_reduce_perf``: exit 1 everywhere) on a 10-node cluster,
  beside another user's 1-node job: the broken job ends FAILED, told that its own image failed
  the preflight (its failure e-mail), no node suspected, checked, cordoned or repaired, the
  breaker closed; the other job runs and completes.

``check(result)`` lists what ended wrong; every flow also owes what ``runner.run_flow`` checks
(nothing stuck, nothing dead-lettered, the backstop invariant after every event).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState

from ..preflight_programs import PreflightPrograms
from ..scripts import load_client_library
from ..server import InProcessOpener, LocalApi
from ..world import World
from .moved_jobs import relaunches
from .runner import DYNAMODB, MIN, CampaignResult, Scenario, known_flow, run_flow, unfinished

FLOWS = ("preflight_forged_baseline", "preflight_forged_loopback", "preflight_broken_image")
RUN_SECONDS = 4 * MIN
RUN_LIMIT_SECONDS = 45 * MIN
POLL_SECONDS = 10
NODE_CLASS = "p5.48xlarge"  # the emulator's nodes (8 x H100, as the simulated fabric)
WRAPPER = ["python", "gpu_recovery_client.py", "preflight", "--", "python", "train.py"]
FORGERY = 1000.0
MISSING_TOOL = "/bin/sh: 1: all_reduce_perf: not found\nModuleNotFoundError: No module named 'torch'\n"
_ROW = re.compile(r"^(\s*\d+\s+\d+\s+\S+\s+\S+\s+-?\d+\s+)(.*)$")


def forged(output: str, factor: float) -> str:
    """``all_reduce_perf``'s table with its algbw and busbw multiplied (a tenant's forgery)."""
    lines = []
    for line in output.splitlines():
        row = _ROW.match(line)
        if row:
            cols = row.group(2).split()  # time algbw busbw #wrong, out-of-place then in-place
            for i in (1, 2, 5, 6):
                if i < len(cols):
                    cols[i] = f"{float(cols[i]) * factor:.2f}"
            line = row.group(1) + "  ".join(cols)
        lines.append(line)
    return "\n".join(lines) + "\n"


@dataclass(kw_only=True)
class EvidenceResult(CampaignResult):
    flow: str
    jobs: dict[str, dict[str, Any]]  # name -> job item
    reboots: dict[str, int]
    health_checks: dict[str, int]
    cordoned: list[str]  # nodes cordoned (or out of service) at the end
    preflights: dict[str, dict[int, dict[str, Any]]]  # job name -> attempt -> its preflight item
    learned: list[str]  # the 2-node baseline's sample ids
    breaker_state: str
    facts: dict[str, Any] = field(default_factory=dict)

    def expectations(self) -> list[str]:
        return expectations(self)



def expectations(result: EvidenceResult) -> list[str]:
    problems: list[str] = []
    if any(result.reboots.values()):
        problems.append(f"reboots {result.reboots} (want none: every node's hardware is healthy)")
    if result.cordoned:
        problems.append(f"nodes out of service at the end: {result.cordoned}")
    if result.breaker_state != "closed":
        problems.append(f"the breaker is {result.breaker_state} "
                        "(want closed: one job's evidence is no fleet event)")
    problems += {"preflight_forged_baseline": _forged_baseline, "preflight_forged_loopback": _forged_loopback,
                 "preflight_broken_image": _broken_image}[result.flow](result)
    return problems


def _complete(result: EvidenceResult, name: str) -> list[str]:
    job = result.jobs.get(name) or {}
    problems = unfinished(job, name)
    if int(job.get("recoveries_used") or 0) or int(job.get("app_restarts_used") or 0):
        problems.append(f"{name} spent {job.get('recoveries_used')} recoveries, "
                        f"{job.get('app_restarts_used')} "
                        "application restarts (want none)")
    return problems


def _no_failure_mails(result: EvidenceResult, *names: str) -> list[str]:
    kinds = ("failed", "application_error", "quarantined")
    return result.mail_problems({(kind, str((result.jobs.get(n) or {}).get("job_id"))): (0, 0)
                                 for n in names for kind in kinds})


def _forged_baseline(result: EvidenceResult) -> list[str]:
    problems = _complete(result, "forger") + _complete(result, "honest")
    if any(result.health_checks.values()):
        problems.append(f"health checks {result.health_checks} (want none: nothing was pinned)")
    for name in ("forger", "honest"):
        statuses = {a: p.get("status") for a, p in (result.preflights.get(name) or {}).items()}
        # A launch given up (its starts kept failing at random) and made again abandons its
        # attempt's preflight (``moved_jobs.relaunches``); the last attempt's passes.
        given_up = [a for a, status in statuses.items() if status == "abandoned" and a < max(statuses)]
        if len(given_up) > relaunches(result, result.jobs.get(name) or {}) or \
                {status for a, status in statuses.items() if a not in given_up} != {"passed"}:
            problems.append(f"{name}'s preflights {statuses} (want passed)")
    honest = str((result.jobs.get("honest") or {}).get("job_id"))
    forger = str((result.jobs.get("forger") or {}).get("job_id"))
    if any(sample.startswith(forger) for sample in result.learned) or \
            not any(sample.startswith(honest) for sample in result.learned):
        problems.append(f"the baseline learned {result.learned} "
                        "(want the honest job's run, not the forger's)")
    return problems + _no_failure_mails(result, "forger", "honest")


def _forged_loopback(result: EvidenceResult) -> list[str]:
    problems = _complete(result, "liar")
    job_id = str((result.jobs.get("liar") or {}).get("job_id"))
    preflights = result.preflights.get("liar") or {}
    pinning = [a for a, p in preflights.items() if p.get("status") == "pinned"]
    if not 1 <= len(pinning) <= 2:
        problems.append(f"attempts {pinning} pinned a node (want 1..cleared_limit 2)")
    lied_on = set(result.facts.get("lied_on") or ())
    if not lied_on or any(result.health_checks.get(n, 0) < 1 for n in lied_on):
        problems.append(f"health checks {result.health_checks} (want each node rank 1 lied about, "
                        f"{sorted(lied_on)}, checked by the stack)")
    final = (preflights.get(max(preflights)) if preflights else None) or {}
    limited = final.get("status") == "inconclusive" and "not handed over" in str(final.get("verdict"))
    if len(pinning) == 2 and not limited:
        problems.append(f"the last preflight {final.get('status')}: {final.get('verdict')} (want "
                        "held back by the job's limit of cleared suspects)")
    want = {("tenant_evidence_limited", job_id): (1, 2) if len(pinning) == 2 else (0, 0)}
    return problems + _no_failure_mails(result, "liar") + result.mail_problems(want)


def _broken_image(result: EvidenceResult) -> list[str]:
    problems = _complete(result, "other")
    job = result.jobs.get("broken") or {}
    if job.get("job_state") != JobState.FAILED.value or "own image or code" not in str(job.get("last_error")):
        problems.append(f"broken {job.get('job_state')}: {str(job.get('last_error'))[:200]} (want FAILED, "
                        "told its own image or code failed the preflight)")
    if int(job.get("recoveries_used") or 0) or int(job.get("attempt") or 0) != 1 or job.get("relocations"):
        problems.append(f"broken at attempt {job.get('attempt')}, {job.get('recoveries_used')} recoveries, "
                        f"relocations {job.get('relocations')} (want attempt 1, none)")
    if any(result.health_checks.values()):
        problems.append(f"health checks {result.health_checks} (want none: no node is suspected)")
    statuses = {a: p.get("status") for a, p in (result.preflights.get("broken") or {}).items()}
    if statuses != {1: "job_fault"}:
        problems.append(f"broken's preflights {statuses} (want attempt 1's job_fault)")
    broken = str(job.get("job_id"))
    return problems + result.mail_problems({("failed", broken): (1, 2)}) + \
        _no_failure_mails(result, "other")


class TenantPreflight(Scenario[EvidenceResult]):
    """One of :data:`FLOWS`: its cluster, its jobs and its tenant's program."""

    run_limit_seconds = RUN_LIMIT_SECONDS

    def __init__(self, flow: str) -> None:
        self.flow = known_flow(flow, FLOWS)
        self.jobs: dict[str, str] = {}  # name -> job id
        self.nodes: list[str] = []
        self.lied_on: set[str] = set()
        self.world: World | None = None

    def world_options(self) -> dict[str, Any]:
        settings = {"min_nodes": 0, "round_seconds": 60}
        return {"extra_env": {C.ENV_CONTROL_API_URL: "https://control.invalid/prod",
                              C.ENV_CONTROL_POLL_SECONDS: str(POLL_SECONDS),
                              C.ENV_RELOCATE_INSTEAD_OF_WAIT: "true",
                              C.ENV_REMEDIATION_SETTINGS: json.dumps({"breaker_max_percent": 75}),
                              C.ENV_PREFLIGHT_SETTINGS: json.dumps(settings)}}

    def _submit(self, world: World, name: str, td: str, nodes: int, mode: str, user: str) -> str:
        spec = {"name": name, "task_definition": td, "nnodes": nodes, "gpus_per_node": 8, "preflight": mode,
                "overrides": {"command": WRAPPER}}
        job_id = world.submit_queue_job(spec, user)
        self.jobs[name] = job_id
        return job_id

    def set_up(self, world: World) -> list[str]:
        sim = world.ecs
        self.world = world
        # The forged baseline's two jobs share two nodes: the honest one runs once the forger's
        # preflight taught (or not) the baseline.
        count = {"preflight_broken_image": 10, "preflight_forged_baseline": 2}.get(self.flow, 4)
        self.nodes = [f"node-{chr(ord('a') + i)}" for i in range(count)]
        td = world.queue_cluster(self.nodes)
        if self.flow == "preflight_forged_baseline":
            self._submit(world, "forger", td, 2, "always", "mallory")
            self._submit(world, "honest", td, 2, "always", "alice")
        elif self.flow == "preflight_forged_loopback":
            self._submit(world, "liar", td, 2, "always", "mallory")
        else:
            self._submit(world, "broken", td, 2, "always", "mallory")
            self._submit(world, "other", td, 1, "off", "bob")
        programs = PreflightPrograms(sim, load_client_library(), opener=InProcessOpener(LocalApi()),
                                     tamper=self._tamper)
        programs.watch(5.0, lambda _task: RUN_SECONDS)
        sim.run_for(MIN + 2)  # the scheduler's tick places them
        return list(self.jobs.values())

    def _tamper(self, job_id: str, rank: int, test: dict[str, Any], exit_code: int | None,
                output: str) -> tuple[int | None, str]:
        name = next((n for n, j in self.jobs.items() if j == job_id), "")
        if name == "forger":
            return exit_code, forged(output, FORGERY)
        if name == "liar" and rank == 1 and test.get("kind") == "loopback":
            world = self.world
            if world is not None:
                self.lied_on |= {t.node for t in world.ecs.tasks.values() if not t.health_check
                                 and t.tags.get(C.TAG_JOB_ID) == job_id and t.tags.get(C.TAG_RANK) == "1"
                                 and not t.done}
            return 1, "NCCL WARN rank 1: loopback failed (as its program says)\n"
        if name == "broken" and test.get("kind") == "loopback":
            return 1, MISSING_TOOL
        return exit_code, output

    def result(self, world: World, common: dict[str, Any]) -> EvidenceResult:
        repo, sim = world.repo, world.ecs
        jobs = {name: repo.jobs.get_job_item(job_id) or {} for name, job_id in self.jobs.items()}
        preflights: dict[str, dict[int, dict[str, Any]]] = {}
        for name, job in jobs.items():
            preflights[name] = {}
            for a in range(1, int(job.get("attempt") or 0) + 1):
                item = repo.preflight.get(self.jobs[name], a)
                if item:
                    preflights[name][a] = item
        checks: dict[str, int] = {}
        for task in sim.tasks.values():
            if task.health_check:
                checks[task.node] = checks.get(task.node, 0) + 1
        out = []
        for node in self.nodes:
            instance = repo.instances.get_instance(sim.node(node).container_instance_id)
            if instance is not None and (instance.cordoned or instance.state.value != "AVAILABLE"):
                out.append(f"{node} ({instance.state.value})")
        return EvidenceResult(
            **common, flow=self.flow, jobs=jobs, reboots={n: sim.nodes[n].reboots for n in self.nodes},
            health_checks=checks, cordoned=out, preflights=preflights,
            learned=list(repo.preflight.baselines(NODE_CLASS, [2])[2].sample_ids),
            breaker_state=str((repo.breaker.read() or {}).get("state", "closed")),
            facts={"lied_on": sorted(self.lied_on)})


def run(flow: str, fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
        dynamodb: str = DYNAMODB) -> EvidenceResult:
    """``flow`` with ``fault`` (n-th call once the jobs are placed, mode) broken once."""
    return run_flow(TenantPreflight(flow), fault, keep_timeline=keep_timeline, dynamodb=dynamodb)
