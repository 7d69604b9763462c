"""The gang preflight's stages with fakes of the ports (tests/recovery/fakes.py: the real
repository on moto's DynamoDB, ECS and the reboot API recorded): the ranks' steps and
reports, as the training client sends them, driven by the simulated fabric; the rounds,
the pins, the handover to the recovery loop's node decisions, the sweep's part."""

from __future__ import annotations

import math
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
    w: World, job_id: str, nodes: list[str], *, mode: str = "auto", restarted: bool = True, gpus: int = 8
) -> None:
    """A queue job's ranks (one per node) at attempt 1, as the launcher and a gang restart leave it."""
    w.register_job(job_id, nodes)
    fields = {"preflight": mode, "gpus_per_node": gpus, "source": "queue", "launch": {"instance_type": ""}}
    if restarted:
        fields["restarted_attempt"] = 1
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

    @property
    def preflights(self) -> Any:
        return self.w.service.preflights

    def step_all(self) -> dict[int, dict[str, Any]]:
        return {
            r: self.preflights.step(self.job_id, r, 1) for r in range(len(self.nodes)) if r not in self.silent
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
                            1,
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
    assert w.repo.get_job("j").state is JobState.RUNNING and w.ecs.stop_calls == []


def test_a_degraded_link_is_pinned_to_its_two_ends_and_their_nodes_rebooted_without_a_diag(w: World) -> None:
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
    job = w.repo.get_job("j")
    assert job.state is JobState.PENDING_HEALTHCHECK and len(w.ecs.stop_calls) == 8
    suspect = w.repo.faults.get_suspect("j", 1, "node-2")
    assert suspect is not None and suspect.record["evidence"]["trigger"] == Trigger.PREFLIGHT.value
    assert suspect.record["plan"]["decision"]["rule_id"] == "preflight-pinned"
    assert "node-5" in suspect.record["evidence"]["preflight"]["peer"]
    w.advance(61)
    w.service.sweep()  # each suspect's deadline: the node decisions, on the fast path
    assert sorted(w.rebooter.calls) == ["i-node-2", "i-node-5"]
    assert w.ecs.health_checks_on("node-2") == [] and w.ecs.health_checks_on("node-5") == []
    job = w.repo.get_job("j")
    assert job.state is JobState.PENDING_RESTART and job.recoveries_used == 0  # spends no budget
    assert w.repo.get_instance("node-2").state is C.InstanceState.REBOOTING


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
    assert w.repo.get_job("j").state is JobState.PENDING_HEALTHCHECK


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
    assert w.repo.get_job("j").state is JobState.RUNNING and w.ecs.stop_calls == []


def test_a_handover_whose_delivery_died_is_finished_by_the_sweep(w: World) -> None:
    nodes = nodes_of(2)
    queue_job(w, "j", nodes, mode="restarts")
    fabric = Fabric()
    fabric.degrade_link("node-0", "node-1", 0.3)
    w.repo.fail_once("enter_recovery", "refuse")
    with pytest.raises(TimeoutError):
        Ranks(w, "j", nodes, fabric).run()
    item = w.repo.preflight.get("j", 1)
    assert item["status"] == "pinned" and not item["handed_over"] and item.get(C.DEADLINE_SK)
    assert w.repo.get_job("j").state is JobState.RUNNING
    assert w.service.preflights.step("j", 1, 1)["action"] == "stop"  # the ranks wait to be stopped
    w.advance(61)
    w.service.sweep()
    assert w.repo.preflight.get("j", 1)["handed_over"] is True
    assert w.repo.get_job("j").state is JobState.PENDING_HEALTHCHECK and len(w.ecs.stop_calls) == 2
    w.service.sweep()  # nothing more: out of the deadline index
    assert w.repo.preflight.get("j", 1).get(C.DEADLINE_SK) is None


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
    assert w.repo.get_job("j").state is JobState.PENDING_HEALTHCHECK
    # No sweep has run: the handover's own invocation did it.
    pinned = w.repo.get_instance("node-1")
    assert pinned.fenced and not pinned.placeable
    assert pinned.suspect_fence["job"] == "j"
    holds = w.repo.cordons.worklist().holds
    for node in nodes:
        assert holds[node]["why"] == placement.RESERVED and holds[node]["job"] == "j", node
        assert w.ecs.attribute_values[node][placement.UNAVAILABLE_ATTRIBUTE] == placement.RESERVED, node
    assert all(w.repo.get_instance(n).placeable for n in nodes if n != "node-1")


def test_a_handover_run_again_by_the_sweep_fences_and_reserves_once_the_job_is_in_recovery(w: World) -> None:
    nodes = nodes_of(2)
    queue_job(w, "j", nodes, mode="restarts")
    fabric = Fabric()
    fabric.degrade_link("node-0", "node-1", 0.3)
    w.repo.fail_once("enter_recovery", "refuse")
    with pytest.raises(TimeoutError):
        Ranks(w, "j", nodes, fabric).run()
    # Not in recovery: no fence (the sweep would check a fenced node alone, for nothing).
    assert not any(w.repo.get_instance(n).fenced for n in nodes)
    w.advance(61)
    w.service.sweep()
    assert w.repo.preflight.get("j", 1)["handed_over"] is True
    assert w.repo.get_job("j").state is JobState.PENDING_HEALTHCHECK
    for node in nodes:  # fenced until judged (or judged already), held, never checked alone
        instance = w.repo.get_instance(node)
        assert instance.fenced or instance.state is not C.InstanceState.AVAILABLE, node
        assert w.ecs.attribute_values[node][placement.UNAVAILABLE_ATTRIBUTE], node
        assert w.ecs.health_checks_on(node) == [], node
