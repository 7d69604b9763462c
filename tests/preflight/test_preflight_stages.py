"""The gang preflight's stages with fakes of the ports (tests/recovery/fakes.py: the real
repository on moto's DynamoDB, ECS and the reboot API recorded): the ranks' steps and
reports, as the training client sends them, driven by the simulated fabric; the rounds,
the pins, the handover to the recovery loop's node decisions, the sweep's part."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from gpu_recovery.domain import placement
from gpu_recovery.domain.fault_vocabulary import Trigger
from gpu_recovery.domain.preflight.settings import parse_preflight_settings
from gpu_recovery.domain.remediation_settings import parse_remediation_settings
from gpu_recovery.repository.base import Update
from local_mode.sim.fabric import Fabric
from tests.recovery.fakes import LostResponse, World, world

MIN_BYTES, MAX_BYTES = 128 * 2**20, 2**30
FLOOR = {"floors": {"8gpu": 250.0}, "min_nodes": 4, "round_seconds": 60}


@pytest.fixture
def w() -> Iterator[World]:
    # Two nodes of a small fake cluster rebooted at once would trip the blast-radius breaker
    # (its own tests' matter): off here.
    with world(
        preflight=parse_preflight_settings(FLOOR),
        remediation=parse_remediation_settings({"breaker_enabled": "false"}),
    ) as built:
        yield built


def queue_job(
    w: World, job_id: str, nodes: list[str], *, mode: str = "auto", restarted: bool = True, gpus: int = 8,
    user: str = "", instance_type: str = "",
) -> None:
    """A queue job's ranks (one per node) at attempt 1, as the launcher and a gang restart leave it."""
    w.register_job(job_id, nodes)
    fields: dict[str, Any] = {"preflight": mode, "gpus_per_node": gpus, "source": "queue",
                              "launch": {"instance_type": instance_type}}
    if restarted:
        fields["restarted_attempt"] = 1
    if user:
        fields.update(user=f"arn:aws:iam::123456789012:user/{user}", quota_subject=user)
    names = {f"#f{i}": k for i, k in enumerate(fields)}
    boto3.resource("dynamodb", region_name="us-east-1").Table("jobs").update_item(
        Key={C.JOB_PK: C.job_item_key(job_id)},
        UpdateExpression="SET " + ", ".join(f"#f{i} = :v{i}" for i in range(len(fields))),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues={f":v{i}": v for i, v in enumerate(fields.values())},
    )


class Ranks:
    """Every rank's wrapper, synchronously: ask, run each test on the fabric, report."""

    def __init__(
        self, w: World, job_id: str, nodes: list[str], fabric: Fabric, silent: frozenset[int] = frozenset()
    ) -> None:
        self.w, self.job_id, self.nodes, self.fabric, self.silent = w, job_id, nodes, fabric, silent
        self.done: set[tuple[int, int, str]] = set()
        self.rounds = 0
        self.attempt = 1

    @property
    def preflights(self) -> Any:
        return self.w.service.preflights

    def step_all(self) -> dict[int, dict[str, Any]]:
        return {
            r: self.preflights.step(self.job_id, r, self.attempt) for r in range(len(self.nodes))
            if r not in self.silent
        }

    def run(self, max_rounds: int = 20) -> dict[int, str]:
        """Until every rank trains or stops; returns each rank's end."""
        ends: dict[int, str] = {}
        for _ in range(max_rounds * 3):
            steps = self.step_all()
            ends = {r: s["action"] for r, s in steps.items() if s["action"] in ("train", "stop", "skip")}
            if len(ends) == len(steps):
                return ends
            self.rounds = max(self.rounds, max(int(s["round"]) for s in steps.values()))
            for rank, step in sorted(steps.items()):
                for test in step.get("tests") or []:
                    key = (int(step["round"]), rank, str(test["id"]))
                    if key in self.done or not test["report"]:
                        continue
                    self.done.add(key)
                    members = [self.nodes[m] for lo, hi in test["members"] for m in range(lo, hi)]
                    run = self.fabric.run(members, 8, MIN_BYTES, MAX_BYTES)
                    if not run.hung:
                        self.preflights.report(
                            self.job_id,
                            rank,
                            self.attempt,
                            round_=int(step["round"]),
                            test_id=test["id"],
                            exit_code=0,
                            output=run.output,
                            seconds=run.seconds,
                            address=f"10.0.0.{rank + 1}",
                        )
        raise AssertionError(f"no end after {max_rounds} rounds: {self.step_all()}")


def nodes_of(n: int) -> list[str]:
    return [f"node-{i}" for i in range(n)]


_ROW = re.compile(r"^(\s*\d+\s+\d+\s+\S+\s+\S+\s+-?\d+\s+)(.*)$")


def forged(output: str, factor: float) -> str:
    """An all_reduce_perf table with its algbw and busbw multiplied (a tenant's forgery)."""
    lines = []
    for line in output.splitlines():
        row = _ROW.match(line)
        if row:
            cols = row.group(2).split()  # time algbw busbw wrong time algbw busbw wrong
            for i in (1, 2, 5, 6):
                cols[i] = f"{float(cols[i]) * factor:.2f}"
            line = row.group(1) + "  ".join(cols)
        lines.append(line)
    return "\n".join(lines)


class ForgingFabric(Fabric):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.forge_factor = factor

    def run(self, nodes: Any, *args: Any, **kwargs: Any) -> Any:
        honest = super().run(nodes, *args, **kwargs)
        return dataclasses.replace(honest, output=forged(honest.output, self.forge_factor),
                                   busbw=honest.busbw * self.forge_factor)


def test_a_forged_x1000_table_is_not_learned_and_the_next_honest_job_is_not_pinned(w: World) -> None:
    """Issue 49: a tenant's table teaches nothing another tenant is judged by."""
    queue_job(w, "forger", nodes_of(2), mode="always")
    assert Ranks(w, "forger", nodes_of(2), ForgingFabric(1000.0)).run() == {0: "train", 1: "train"}
    assert w.repo.preflight.get("forger", 1)["status"] == "passed"
    assert w.repo.preflight.baselines("8gpu", [2])[2].samples == ()  # above any physical bound
    honest = [f"node-{i}" for i in range(4, 6)]
    queue_job(w, "honest", honest, mode="always")
    assert Ranks(w, "honest", honest, Fabric()).run() == {0: "train", 1: "train"}
    item = w.repo.preflight.get("honest", 1)
    assert item["status"] == "passed" and not item.get("pinned") and w.rebooter.calls == []


def test_one_users_forged_runs_do_not_make_another_users_honest_job_slow(w: World) -> None:
    """Issue 49 (the audit): plausible forged tables (under the physical bound) were learned, and
    three raised the 2 x p5 threshold everyone is held to over an honest run: the victim's nodes
    became suspects at its expense. A user's runs are now one vote: they judge that user alone
    until other users teach, and the fleet's median of users' medians still catches a bad link."""
    def run(job: str, user: str, index: int, fabric: Fabric) -> dict[int, str]:
        nodes = [f"node-{2 * index}", f"node-{2 * index + 1}"]
        queue_job(w, job, nodes, mode="always", user=user, instance_type="p5.48xlarge")
        return Ranks(w, job, nodes, fabric).run()

    for i in range(6):  # x1.6: ~477 GB/s, under p5's 500 GB/s bound: learned, as mallory's
        assert run(f"forger-{i}", "mallory", i, ForgingFabric(1.6)) == {0: "train", 1: "train"}
    assert len(w.repo.preflight.baselines("p5.48xlarge", [2])[2].samples) == 6
    for i, user in enumerate(("ann", "bob", "cat", "dan")):  # honest: ~298 GB/s
        assert run(user, user, 6 + i, Fabric()) == {0: "train", 1: "train"}
        item = w.repo.preflight.get(user, 1)
        assert item["status"] == "passed" and not item.get("pinned"), item["verdict"]
    judged = w.repo.preflight.get("dan", 1)["thresholds"]["2"]  # 0.8 x median(477, 298, 298, 298)
    assert judged["gbps"] == pytest.approx(0.8 * 298, rel=0.02) and "of 4 users' medians" in judged["source"]
    degraded = Fabric()
    degraded.degrade_link("node-20", "node-21", 0.3)
    assert run("eve", "eve", 10, degraded) == {0: "stop", 1: "stop"}
    assert w.repo.preflight.get("eve", 1)["status"] == "pinned" and w.rebooter.calls == []


def test_a_baseline_item_of_the_old_shape_judges_nobody_and_is_rewritten_by_the_next_run(w: World) -> None:
    """Its user-less samples may be the forgery (x1.6 here): read as nothing, then migrated."""
    table = boto3.resource("dynamodb", region_name="us-east-1").Table("instances")
    key = {C.INSTANCE_PK: f"{C.PREFLIGHT_BASELINE_PREFIX}p5.48xlarge#2"}
    table.put_item(Item={**key, "item_type": "PREFLIGHT_BASELINE", "samples": [477] * 8, "version": 8,
                         "sample_ids": [f"old-{i}#1" for i in range(8)]})
    queue_job(w, "ann", nodes_of(2), mode="always", user="ann", instance_type="p5.48xlarge")
    assert Ranks(w, "ann", nodes_of(2), Fabric()).run() == {0: "train", 1: "train"}
    item = table.get_item(Key=key)["Item"]
    assert item["version"] == 9 and "samples" not in item and "sample_ids" not in item
    assert w.repo.preflight.baselines("p5.48xlarge", [2])[2].sample_ids == ("ann#1",)


def test_a_passing_preflight_lets_every_rank_train_and_learns_its_run_once(w: World) -> None:
    nodes = nodes_of(4)
    queue_job(w, "j", nodes)
    ranks = Ranks(w, "j", nodes, Fabric())
    assert ranks.run() == {r: "train" for r in range(4)}
    item = w.repo.preflight.get("j", 1)
    assert item["status"] == "passed" and item["round"] == 1 and "gang passed" in item["verdict"]
    learned = w.repo.preflight.baselines("8gpu", [1, 4])
    assert learned[4].sample_ids == ("j#1",) and learned[1].sample_ids == ("j#1",)
    # the 1 GB busbw the gang measured (the fabric's 4-node run)
    assert learned[4].samples[0] == pytest.approx(
        Fabric().run(nodes, 8, MIN_BYTES, MAX_BYTES).busbw, rel=0.01
    )
    again = w.service.preflights.report(
        "j",
        0,
        1,
        round_=1,
        test_id="gang",
        exit_code=0,
        output=Fabric().run(nodes, 8, MIN_BYTES, MAX_BYTES).output,
    )
    assert again["accepted"] is False and again["action"] == "train"
    assert w.repo.preflight.baselines("8gpu", [4])[4].sample_ids == ("j#1",)  # not learned twice
    assert w.repo.jobs.get_job("j").state is JobState.RUNNING and w.ecs.stop_calls == []


def test_the_preflight_is_its_own_cause_in_the_jobs_goodput_ledger(w: World) -> None:
    """Issue 52: the attempt's time until its preflight passed is ``preflight``, not training."""
    from gpu_recovery.queue.jobs_api.reads import goodput_view

    nodes = nodes_of(4)
    queue_job(w, "j", nodes)
    w.advance(30)
    assert Ranks(w, "j", nodes, Fabric()).run() == {r: "train" for r in range(4)}
    w.advance(100)
    seconds = goodput_view(w.repo.jobs.get_job_item("j"))["seconds"]
    assert seconds["preflight"] == pytest.approx(30)
    assert seconds["productive"] == pytest.approx(100)


def test_a_degraded_link_pinned_to_its_two_ends_gets_the_stacks_own_check_not_a_reboot(w: World) -> None:
    """Issue 49: the preflight is the tenant's program: its pins make suspects for the stack's
    DCGM check (rule preflight-pinned: health_check), never a reboot on its word; the check's
    verdict decides (here healthy: the nodes are cleared, the job restarts, no budget spent)."""
    nodes = nodes_of(8)
    queue_job(w, "j", nodes)
    fabric = Fabric()
    fabric.degrade_link("node-2", "node-5", 0.3)
    ranks = Ranks(w, "j", nodes, fabric)
    assert set(ranks.run().values()) == {"stop"}
    item = w.repo.preflight.get("j", 1)
    assert item["status"] == "pinned" and item["handed_over"] is True
    assert sorted(p["node"] for p in item["pinned"]) == ["node-2", "node-5"]
    assert ranks.rounds <= 2 * math.ceil(math.log2(8))
    assert len(item["summary"]) == ranks.rounds and item["summary"][0].startswith("round 1: gang of 8 slow")
    job = w.repo.jobs.get_job("j")
    assert job.state is JobState.PENDING_HEALTHCHECK and len(w.ecs.stop_calls) == 8
    suspect = w.repo.faults.get_suspect("j", 1, "node-2")
    assert suspect is not None and suspect.record["evidence"]["trigger"] == Trigger.PREFLIGHT.value
    assert suspect.record["plan"]["decision"]["rule_id"] == "preflight-pinned"
    assert "node-5" in suspect.record["evidence"]["preflight"]["peer"]
    w.advance(61)
    assert suspect.record["plan"]["action"] == "health_check"
    for arn in list(w.ecs.stop_calls):  # the ranks stopped: their nodes are free for the check
        w.service.on_task_state_change(w.task_stopped(arn, exit_code=143, stop_code="UserInitiated",
                                                      reason="gpu-recovery: gang preflight pinned"))
    w.service.sweep()  # each suspect's deadline: the stack's own check on each pinned node
    assert w.rebooter.calls == []
    checks = [w.ecs.health_checks_on(n) for n in ("node-2", "node-5")]
    assert [len(c) for c in checks] == [1, 1]
    for [task] in checks:
        w.service.on_health_check_stopped(w.health_check_stopped(task, 0))  # the diag passes
    assert w.rebooter.calls == []
    states = {w.repo.instances.get_instance(n).state for n in ("node-2", "node-5")}
    assert states == {C.InstanceState.AVAILABLE}
    job = w.repo.jobs.get_job("j")  # restarted (attempt 2), spending no budget
    assert job.attempt == 2 and job.recoveries_used == 0 and job.app_restarts_used == 0


def test_a_node_whose_rank_never_reports_is_pinned_when_the_round_times_out(w: World) -> None:
    nodes = nodes_of(4)
    queue_job(w, "j", nodes)
    fabric = Fabric()
    fabric.hang_node("node-3")  # its all-reduces never end: its loopback never reports
    ranks = Ranks(w, "j", nodes, fabric)
    for rank, step in ranks.step_all().items():
        # The gang opens only once every loopback arrived: first, each rank's own.
        assert step["action"] == "run" and [t["id"] for t in step["tests"]] == ["loopback"]
        run = fabric.run([nodes[rank]], 8, MIN_BYTES, MAX_BYTES)
        if not run.hung:
            w.service.preflights.report(
                "j", rank, 1, round_=1, test_id="loopback", exit_code=0, output=run.output
            )
    assert [t["id"] for t in w.service.preflights.step("j", 0, 1)["tests"]] == ["loopback"]
    w.advance(2 * 60 + 1)
    w.service.sweep()
    item = w.repo.preflight.get("j", 1)
    assert item["status"] == "pinned" and [p["node"] for p in item["pinned"]] == ["node-3"]
    assert (
        "never reported" in item["pinned"][0]["reason"] and "no report from rank(s) 3" in item["summary"][0]
    )
    assert w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK


def test_a_gang_that_hangs_is_searched_and_the_hanging_node_pinned(w: World) -> None:
    nodes = nodes_of(4)
    queue_job(w, "j", nodes)
    fabric = Fabric()
    fabric.slow_network("node-1", 0.001)  # its groups crawl: the gang does not report in time
    ranks = Ranks(w, "j", nodes, fabric)
    ranks.step_all()
    for rank in range(4):
        run = fabric.run([nodes[rank]], 8, MIN_BYTES, MAX_BYTES)
        w.service.preflights.report(
            "j", rank, 1, round_=1, test_id="loopback", exit_code=0, output=run.output
        )
    assert [t["id"] for t in w.service.preflights.step("j", 2, 1)["tests"]] == ["loopback", "gang"]
    w.advance(60 + 1)  # the gang's own bound (round_seconds) passes without its report
    w.service.sweep()
    item = w.repo.preflight.get("j", 1)
    assert item["status"] == "running" and item["round"] == 2 and "gang of 4 hung" in item["summary"][0]
    ranks.done = {(1, r, t) for r in range(4) for t in ("loopback", "gang")}
    assert set(ranks.run().values()) == {"stop"}
    assert [p["node"] for p in w.repo.preflight.get("j", 1)["pinned"]] == ["node-1"]


def test_slowness_everywhere_pins_nothing_and_the_job_trains(w: World) -> None:
    nodes = nodes_of(8)
    queue_job(w, "j", nodes)
    fabric = Fabric()
    for node in nodes[:5]:
        fabric.slow_node(node, 0.3)  # five loopbacks fail: the fabric or the baseline, not five nodes
    assert set(Ranks(w, "j", nodes, fabric).run().values()) == {"train"}
    item = w.repo.preflight.get("j", 1)
    assert item["status"] == "inconclusive" and "not a few nodes" in item["verdict"]
    assert w.repo.jobs.get_job("j").state is JobState.RUNNING and w.ecs.stop_calls == []


def test_a_handover_whose_delivery_died_is_finished_by_the_sweep(w: World) -> None:
    nodes = nodes_of(2)
    queue_job(w, "j", nodes, mode="restarts")
    fabric = Fabric()
    fabric.degrade_link("node-0", "node-1", 0.3)
    w.repo.fail_once("rank_events.enter_recovery", "refuse")
    with pytest.raises(TimeoutError):
        Ranks(w, "j", nodes, fabric).run()
    item = w.repo.preflight.get("j", 1)
    assert item["status"] == "pinned" and not item["handed_over"] and item.get(C.DEADLINE_SK)
    assert w.repo.jobs.get_job("j").state is JobState.RUNNING
    assert w.service.preflights.step("j", 1, 1)["action"] == "stop"  # the ranks wait to be stopped
    w.advance(61)
    w.service.sweep()
    assert w.repo.preflight.get("j", 1)["handed_over"] is True
    assert w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK and len(w.ecs.stop_calls) == 2
    w.service.sweep()  # nothing more: out of the deadline index
    assert w.repo.preflight.get("j", 1).get(C.DEADLINE_SK) is None


def test_a_handover_whose_entry_answer_was_lost_names_its_suspects_before_any_rank_ends(w: World) -> None:
    """Given a preflight that pinned both ends of a degraded link, whose handover's entry into
    recovery committed and lost its answer, When the sweep's run of the handover dies too (before
    naming the suspects) and the sweep stops the ranks, which end, Then the fault counts both
    pinned nodes: the job waits for their checks instead of restarting on them unchecked (the
    pins named by the entry's own write; preflight_pin at 5 % of calls failing, seed 9)."""
    nodes = nodes_of(2)
    queue_job(w, "j", nodes, mode="restarts")
    fabric = Fabric()
    fabric.degrade_link("node-0", "node-1", 0.3)
    w.repo.fail_once("rank_events.enter_recovery", "lose")
    with pytest.raises(LostResponse):
        Ranks(w, "j", nodes, fabric).run()
    assert w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK
    w.advance(61)
    w.repo.fail_once("latches.arrive", "refuse")
    w.service.sweep()
    assert len(w.ecs.stop_calls) == 2
    for arn in list(w.ecs.stop_calls):
        w.service.on_task_state_change(w.task_stopped(arn, exit_code=143, stop_code="UserInitiated",
                                                      reason="gpu-recovery: gang preflight pinned"))
    job = w.repo.jobs.get_job("j")
    assert (job.state, job.attempt, job.tally.total) == (JobState.PENDING_HEALTHCHECK, 1, 2)


def test_a_report_whose_answer_was_lost_counts_once(w: World) -> None:
    nodes = nodes_of(2)
    queue_job(w, "j", nodes, mode="restarts")
    fabric = Fabric()
    for rank in (0, 1):
        w.service.preflights.step("j", rank, 1)
        loopback = fabric.run([nodes[rank]], 8, MIN_BYTES, MAX_BYTES)
        w.service.preflights.report(
            "j", rank, 1, round_=1, test_id="loopback", exit_code=0, output=loopback.output
        )
    gang = fabric.run(nodes, 8, MIN_BYTES, MAX_BYTES).output
    repo = w.repo.preflight
    conclude = repo.conclude

    def lost(
        *args: Any, **kwargs: Any
    ) -> bool:  # the passing conclusion (and the baseline) written, its answer lost
        repo.conclude = conclude
        conclude(*args, **kwargs)
        raise LostResponse("TransactWriteItems: response lost")

    repo.conclude = lost
    with pytest.raises(LostResponse):
        w.service.preflights.report("j", 0, 1, round_=1, test_id="gang", exit_code=0, output=gang)
    again = w.service.preflights.report("j", 0, 1, round_=1, test_id="gang", exit_code=0, output=gang)
    assert again["action"] == "train" and again["accepted"] is False
    assert w.repo.preflight.baselines("8gpu", [2])[2].sample_ids == ("j#1",)


def test_which_attempts_run_it(w: World) -> None:
    queue_job(w, "small", nodes_of(2), restarted=True)  # auto below min_nodes (4): none
    assert w.service.preflights.step("small", 0, 1)["action"] == "skip"
    queue_job(w, "first", nodes_of(4), restarted=False)  # auto, a first start: none
    assert w.service.preflights.step("first", 0, 1)["action"] == "skip"
    queue_job(w, "asks", nodes_of(2), mode="always", restarted=False)
    assert w.service.preflights.step("asks", 1, 1)["action"] == "run"
    assert w.service.preflights.step("asks", 1, 2)["action"] == "stop"  # not the job's attempt
    assert w.repo.preflight.get("small", 1) is None  # nothing written for an attempt that runs none


# Issue 49 (why 6): the handover keeps the pinned nodes, and the job's other nodes, out of new
# placement in the invocation that concludes the preflight, as the task-event path does for a
# rank's fault (its stop's fence, PlacementHolds.on_fault): not a minute later at the sweep.
def test_the_handover_fences_the_pinned_node_and_reserves_the_jobs_nodes_before_any_sweep(w: World) -> None:
    nodes = nodes_of(4)
    queue_job(w, "j", nodes)
    fabric = Fabric()
    fabric.slow_node("node-1", 0.3)  # its loopback fails: pinned alone
    assert set(Ranks(w, "j", nodes, fabric).run().values()) == {"stop"}
    item = w.repo.preflight.get("j", 1)
    assert item["handed_over"] is True and [p["node"] for p in item["pinned"]] == ["node-1"]
    assert w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK
    # No sweep has run: the handover's own invocation did it.
    pinned = w.repo.instances.get_instance("node-1")
    assert pinned.fenced and not pinned.placeable
    assert pinned.suspect_fence["job"] == "j"
    holds = w.repo.cordons.worklist().holds
    for node in nodes:
        assert holds[node]["why"] == placement.RESERVED and holds[node]["job"] == "j", node
        assert w.ecs.attribute_values[node][placement.UNAVAILABLE_ATTRIBUTE] == placement.RESERVED, node
    assert all(w.repo.instances.get_instance(n).placeable for n in nodes if n != "node-1")


def test_a_handover_run_again_by_the_sweep_fences_and_reserves_once_the_job_is_in_recovery(w: World) -> None:
    nodes = nodes_of(2)
    queue_job(w, "j", nodes, mode="restarts")
    fabric = Fabric()
    fabric.degrade_link("node-0", "node-1", 0.3)
    w.repo.fail_once("rank_events.enter_recovery", "refuse")
    with pytest.raises(TimeoutError):
        Ranks(w, "j", nodes, fabric).run()
    # Not in recovery: no fence (the sweep would check a fenced node alone, for nothing).
    assert not any(w.repo.instances.get_instance(n).fenced for n in nodes)
    w.advance(61)
    w.service.sweep()
    assert w.repo.preflight.get("j", 1)["handed_over"] is True
    assert w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK
    for node in nodes:  # fenced until judged (or judged already), held, never checked alone
        instance = w.repo.instances.get_instance(node)
        assert instance.fenced or instance.state is not C.InstanceState.AVAILABLE, node
        assert w.ecs.attribute_values[node][placement.UNAVAILABLE_ATTRIBUTE], node
        assert w.ecs.health_checks_on(node) == [], node


def test_loopbacks_failing_alike_on_every_node_end_the_job_told_why_and_pin_no_node(w: World) -> None:
    """Issue 49: an image without all_reduce_perf (the client's fallback exits 1 on every node)
    is the job's own failure: FAILED with a clear reason, no node suspected, checked or cordoned,
    no budget spent."""
    nodes = nodes_of(2)
    queue_job(w, "broken", nodes, mode="always")
    for rank in range(2):
        assert w.service.preflights.step("broken", rank, 1)["action"] == "run"
        w.service.preflights.report("broken", rank, 1, round_=1, test_id="loopback", exit_code=1,
                                    output="python: can't open file 'all_reduce_perf': No such file",
                                    seconds=1.0, address=f"10.0.0.{rank + 1}")
    item = w.repo.preflight.get("broken", 1)
    assert item["status"] == "job_fault" and "own image or code" in item["verdict"]
    assert {w.service.preflights.step("broken", r, 1)["action"] for r in range(2)} == {"stop"}
    w.service.sweep()
    job = w.repo.jobs.get_job("broken")
    assert job.state is JobState.FAILED and "own image or code failed the gang preflight" in job.last_error
    assert job.recoveries_used == 0 and job.app_restarts_used == 0
    assert w.repo.faults.suspects("broken", 1) == []
    assert all(w.ecs.health_checks_on(n) == [] for n in nodes) and w.rebooter.calls == []
    assert all(not w.repo.instances.get_instance(n).cordoned for n in nodes)
    assert [n.kind for n in w.notifier.sent] == [C.NotificationKind.FAILED]
    assert w.repo.preflight.get("broken", 1)["handed_over"] is True


def test_one_node_failing_its_loopback_is_still_a_suspect_not_the_jobs_fault(w: World) -> None:
    nodes = nodes_of(2)
    queue_job(w, "j", nodes, mode="always")
    for rank, code in ((0, 0), (1, 1)):
        w.service.preflights.step("j", rank, 1)
        run = Fabric().run([nodes[rank]], 8, MIN_BYTES, MAX_BYTES)
        w.service.preflights.report("j", rank, 1, round_=1, test_id="loopback", exit_code=code,
                                    output=run.output, seconds=run.seconds, address=f"10.0.0.{rank + 1}")
    item = w.repo.preflight.get("j", 1)
    assert item["status"] == "pinned" and [p["node"] for p in item["pinned"]] == ["node-1"]


class _Recorded:
    def __init__(self) -> None:
        self.by: list[tuple[str, dict[str, str]]] = []

    def add_metric(self, name: str, unit: str, value: float) -> None:
        return None

    def add_metric_now(self, name: str, unit: str, value: float) -> None:
        return None

    def add_dimensioned_metric(self, name: str, unit: str, value: float, dimensions: dict[str, str]) -> None:
        self.by.append((name, dimensions))


def _pinned_then_cleared(w: World, ranks: Ranks, stopped_before: int) -> None:
    """The attempt's preflight pins the degraded link's ends; its ranks stop; the stack's
    check on each pinned node passes."""
    assert set(ranks.run().values()) == {"stop"}
    w.advance(61)
    for arn in list(w.ecs.stop_calls)[stopped_before:]:
        w.service.on_task_state_change(w.task_stopped(arn, exit_code=143, stop_code="UserInitiated",
                                                      reason="gpu-recovery: gang preflight pinned"))
    w.service.sweep()
    for node in ("node-2", "node-5"):
        task = next(t for t in reversed(w.ecs.health_checks_on(node)) if t.last_status != "STOPPED")
        w.service.on_health_check_stopped(w.health_check_stopped(task, 0))  # cleared


def test_a_job_whose_pins_the_stacks_check_cleared_twice_pins_nothing_more(w: World) -> None:
    """Issue 49: a job whose evidence condemned nodes the stack's check cleared is limited
    (cleared_limit 2 faults in 24 h): an operator is told, its next preflight pins nothing, and
    each clearance is a SuspectsCleared metric of its evidence source."""
    metrics = _Recorded()
    w.service.metrics = metrics
    nodes = nodes_of(8)
    queue_job(w, "j", nodes)
    fabric = Fabric()
    fabric.degrade_link("node-2", "node-5", 0.3, persistent=True)  # a link the DCGM diag cannot see
    _pinned_then_cleared(w, Ranks(w, "j", nodes, fabric), 0)
    assert metrics.by == [("SuspectsCleared", {"EvidenceSource": "tenant_preflight"})] * 2
    assert w.repo.tenant_evidence.cleared("job", "j", w.now[0], 86400) == 1  # one fault, both ends
    limited = C.NotificationKind.TENANT_EVIDENCE_LIMITED
    assert not [n for n in w.notifier.sent if n.kind is limited]
    assert w.repo.jobs.get_job("j").attempt == 2
    second = Ranks(w, "j", nodes, fabric)
    second.attempt = 2
    _pinned_then_cleared(w, second, len(w.ecs.stop_calls))
    assert w.repo.tenant_evidence.cleared("job", "j", w.now[0], 86400) == 2
    told = [n for n in w.notifier.sent if n.kind is limited]
    assert len(told) == 1 and "no longer moves nodes" in told[0].subject
    assert w.repo.jobs.get_job("j").attempt == 3
    third = Ranks(w, "j", nodes, fabric)
    third.attempt = 3
    assert set(third.run().values()) == {"train"}  # the link still fails, nothing is pinned
    item = w.repo.preflight.get("j", 3)
    assert item["status"] == "inconclusive" and "pins are not handed over" in item["verdict"]
    assert w.repo.jobs.get_job("j").state is JobState.RUNNING and w.rebooter.calls == []


def test_a_pinned_node_whose_check_gave_no_verdict_is_no_clearance_of_the_tenants_word(w: World) -> None:
    """Issue 49: the pinned nodes' checks never end (no verdict by the check's timeout): the
    nodes leave their checks as they were and the job goes on, but nothing is counted against
    the job's evidence (no SuspectsCleared, no clearance): a missing answer judges no one."""
    metrics = _Recorded()
    w.service.metrics = metrics
    nodes = nodes_of(8)
    queue_job(w, "j", nodes)
    fabric = Fabric()
    fabric.degrade_link("node-2", "node-5", 0.3, persistent=True)
    assert set(Ranks(w, "j", nodes, fabric).run().values()) == {"stop"}
    w.advance(61)
    for arn in list(w.ecs.stop_calls):
        w.service.on_task_state_change(w.task_stopped(arn, exit_code=143, stop_code="UserInitiated",
                                                      reason="gpu-recovery: gang preflight pinned"))
    w.service.sweep()
    assert all(w.ecs.health_checks_on(node) for node in ("node-2", "node-5"))
    for _ in range(40):  # past health_check_timeout_seconds, no check ever ends
        w.advance(61)
        w.service.sweep()
    timeouts = [n for n in w.notifier.sent if n.kind is C.NotificationKind.HEALTH_CHECK_TIMEOUT]
    assert len(timeouts) == 2, [n.kind for n in w.notifier.sent]
    assert w.repo.jobs.get_job("j").attempt == 2
    assert metrics.by == []
    assert w.repo.tenant_evidence.cleared("job", "j", w.now[0], 86400) == 0


def test_no_loopback_reported_anywhere_is_missing_evidence_not_a_job_or_node_fault(w: World) -> None:
    """Issue 49: every rank silent past the bound (the API unreachable, a wrapper hung) pins
    nothing and fails nothing: inconclusive, the job goes on."""
    nodes = nodes_of(2)
    queue_job(w, "j", nodes, mode="always")
    for rank in range(2):
        w.service.preflights.step("j", rank, 1)
    w.advance(10_000)
    w.service.sweep()
    item = w.repo.preflight.get("j", 1)
    assert item["status"] == "inconclusive" and "no node reported" in item["verdict"]
    assert w.repo.jobs.get_job("j").state is JobState.RUNNING and w.repo.faults.suspects("j", 1) == []


def test_a_clearance_is_counted_with_its_decision_whatever_is_lost_after_the_commit(w: World) -> None:
    """Issue 49's campaign defect: each clearing decision's response lost after it committed
    (its delivery dies, the redelivery finds the check answered): the count is the commit's,
    so the job still reaches its limit after two cleared faults and pins nothing more."""
    nodes = nodes_of(8)
    queue_job(w, "j", nodes)
    fabric = Fabric()
    fabric.degrade_link("node-2", "node-5", 0.3, persistent=True)
    for attempt in (1, 2):
        ranks = Ranks(w, "j", nodes, fabric)
        ranks.attempt = attempt
        stopped_before = len(w.ecs.stop_calls)
        assert set(ranks.run().values()) == {"stop"}
        w.advance(61)
        for arn in list(w.ecs.stop_calls)[stopped_before:]:
            w.service.on_task_state_change(w.task_stopped(arn, exit_code=143, stop_code="UserInitiated",
                                                          reason="gpu-recovery: gang preflight pinned"))
        w.service.sweep()
        for node in ("node-2", "node-5"):
            task = next(t for t in reversed(w.ecs.health_checks_on(node)) if t.last_status != "STOPPED")
            event = w.health_check_stopped(task, 0)
            w.repo.fail_once("decisions.record", "lose")
            with pytest.raises(LostResponse):
                w.service.on_health_check_stopped(event)
            w.service.on_health_check_stopped(event)  # Lambda's retry
        for _ in range(3):
            w.advance(61)
            w.service.sweep()
    assert w.repo.tenant_evidence.cleared("job", "j", w.now[0], 86400) == 2
    assert w.repo.jobs.get_job("j").attempt == 3
    third = Ranks(w, "j", nodes, fabric)
    third.attempt = 3
    assert set(third.run().values()) == {"train"}
    assert w.rebooter.calls == []


def test_a_rank_whose_start_was_held_up_gets_a_round_of_its_own_before_it_is_pinned(w: World) -> None:
    """Given a 4-node job whose ranks 0-2 report their loopbacks and whose rank 3 started (its
    StartTask tried again after failures) only 5 s before the loopbacks' bound, When the bound
    passes, Then rank 3 is not pinned yet: the bound moves to a round after its start; and when
    that round passes with no report from it, its node is pinned as never reporting."""
    from gpu_recovery import clock

    nodes = nodes_of(4)
    queue_job(w, "j", nodes)
    fabric = Fabric()
    ranks = Ranks(w, "j", nodes, fabric, silent=frozenset({3}))
    for rank in ranks.step_all():
        run = fabric.run([nodes[rank]], 8, MIN_BYTES, MAX_BYTES)
        w.service.preflights.report("j", rank, 1, round_=1, test_id="loopback", exit_code=0,
                                    output=run.output)
    w.advance(2 * 60 - 5)
    late_start = clock.now()
    boto3.resource("dynamodb", region_name="us-east-1").Table("jobs").update_item(
        Key={C.JOB_PK: C.rank_item_key("j", 3)}, UpdateExpression="SET registered_at = :at",
        ExpressionAttributeValues={":at": int(late_start)})
    w.advance(6)
    w.service.sweep()
    item = w.repo.preflight.get("j", 1)
    assert item["status"] == "running", item.get("summary")
    assert float(item[C.DEADLINE_SK]) == int(late_start) + 60  # a round (round_seconds) after its start
    w.advance(60)
    w.service.sweep()
    item = w.repo.preflight.get("j", 1)
    assert item["status"] == "pinned" and [p["node"] for p in item["pinned"]] == ["node-3"]
    assert "never reported" in item["pinned"][0]["reason"]


def test_a_pinned_launch_whose_last_end_died_before_the_latch_head_is_counted_by_a_paced_round(
        w: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a queue launch whose preflight pins node-1 (its loopback failed) and whose rank 1's
    STOPPED event, every delivery, wrote the rank's end on its latch shard and died before the
    latch head's write (the shard complete, the head not), When the sweeps come, Then the stop
    intent does not end on the shards' word: its paced round handles rank 1 as its lost event, the
    ENDED latch completes, and once node-1's check passes the job restarts (8 % sweep
    preflight_forged_loopback s43: PENDING_HEALTHCHECK until its backstop)."""
    from gpu_recovery.constants import latch_head_key
    from gpu_recovery.domain.latch import Latch

    nodes = nodes_of(2)
    queue_job(w, "j", nodes, mode="always", restarted=False)
    w.repo.tables.db.apply(Update(table="jobs", key={C.JOB_PK: C.job_item_key("j")}, set_fields={
        "start_fanout": {"attempt": 1, "kind": "launch", "at": w.now[0], "sent_at": w.now[0]}}))
    for rank, code in ((0, 0), (1, 1)):
        w.service.preflights.step("j", rank, 1)
        run = Fabric().run([nodes[rank]], 8, MIN_BYTES, MAX_BYTES)
        w.service.preflights.report("j", rank, 1, round_=1, test_id="loopback", exit_code=code,
                                    output=run.output, seconds=run.seconds, address=f"10.0.0.{rank + 1}")
    assert w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK
    db = w.repo.latches.base.db
    write = db.apply_returning
    dying = {"on": True}

    def head_write_dies(update: Any, **kwargs: Any) -> Any:
        if dying["on"] and update.key.get(C.JOB_PK) == latch_head_key("j", 1) \
                and Latch.ENDED.head_attribute in (update.add_to_sets or {}):
            raise RuntimeError("the delivery dies before the latch head's write")
        return write(update, **kwargs)

    monkeypatch.setattr(db, "apply_returning", head_write_dies)
    arns = list(w.ecs.stop_calls)
    assert len(arns) == 2
    for arn in arns:
        event = w.task_stopped(arn, exit_code=143, stop_code="UserInitiated",
                               reason="gpu-recovery: gang preflight pinned")
        for _ in range(3):  # the last end's three deliveries each die at the head's write
            try:
                w.service.on_task_state_change(event)
                break
            except RuntimeError:
                continue
    assert Latch.ENDED not in w.repo.latches.complete("j", 1, 2), "the premise: the head missed the end"
    dying["on"] = False
    for _ in range(8):
        w.advance(61)
        w.service.sweep()
        for task in [t for t in w.ecs.health_checks_on("node-1") if t.last_status != "STOPPED"]:
            w.service.on_health_check_stopped(w.health_check_stopped(task, 0))  # the check passes
    assert Latch.ENDED in w.repo.latches.complete("j", 1, 2)
    job = w.repo.jobs.get_job("j")
    assert job.attempt == 2 and job.recoveries_used == 0, (job.state, job.last_error)
