"""Pure pieces of the large-jobs design: latch shards, fault tallies, the ECS budget's
GCRA, grouped StartTask plans and gang batches."""

from __future__ import annotations

import pytest

from gpu_recovery.domain import latch
from gpu_recovery.domain.fault_tally import FaultTally
from gpu_recovery.domain.gang_batches import START, STOP, GangBatch, batches
from gpu_recovery.domain.launch_plan import (
    PlannedRank,
    parse_ranks_tag,
    plan_calls,
    ranks_tag_value,
    spec_key,
)
from gpu_recovery.domain.rate_limit import TokenBucket, floor_seconds, reserve
from gpu_recovery.domain.states import JobOutcome, SuspectVerdict


@pytest.mark.parametrize("world_size", [1, 63, 64, 65, 1024, 8192])
def test_latch_shards_cover_every_rank_exactly_once(world_size: int) -> None:
    shards = latch.shard_count(world_size)
    assert sum(latch.shard_size(world_size, s) for s in range(shards)) == world_size
    assert all(0 < latch.shard_size(world_size, s) <= latch.RANKS_PER_SHARD for s in range(shards))
    assert latch.shard_of(world_size - 1) == shards - 1
    assert latch.latch_complete(world_size, shards) and not latch.latch_complete(world_size, shards - 1)


@pytest.mark.parametrize(
    ("verdicts", "pending", "relocatable", "expected"),
    [
        (["HEALTHY"], 0, False, JobOutcome.RESTART),
        (["HEALTHY"], 1, False, JobOutcome.WAIT),
        (["REBOOT"], 0, False, JobOutcome.RESTART_AFTER_REBOOT),
        (["REBOOT"], 1, False, JobOutcome.RESTART_AFTER_REBOOT),
        (["REBOOT", "HEALTHY"], 0, False, JobOutcome.RESTART_AFTER_REBOOT),
        (["REPLACE", "REBOOT"], 0, False, JobOutcome.FAIL_NODE_FAULT),
        (["REPLACE", "REBOOT"], 0, True, JobOutcome.RELOCATE),
        (["OPERATOR_ACTION"], 0, False, JobOutcome.FAIL_NODE_FAULT),
        (["BLOCKED"], 0, True, JobOutcome.RELOCATE),
        (["TIMEOUT"], 0, False, JobOutcome.FAIL_NODE_FAULT),
    ],
)
def test_a_tally_combines_every_suspect_nodes_verdict(verdicts: list[str], pending: int, relocatable: bool,
                                                      expected: JobOutcome) -> None:
    """Given the verdicts of a fault's suspect nodes (``pending`` still to come), Then the job's
    fate is decided once: an unusable node relocates or fails it at once, a reboot restarts it
    once the node is back, all healthy restarts it (the budget is settled by the caller)."""
    tally = FaultTally(attempt=1, total=len(verdicts) + pending)
    for label in verdicts:
        tally = tally.with_verdict(SuspectVerdict(label))
    assert tally.outcome(relocatable=relocatable) is expected
    assert expected.fails == expected.value.startswith("fail_")


def test_a_tally_decides_as_the_per_node_verdicts_did() -> None:
    tally = FaultTally(attempt=1)
    assert tally.outcome(relocatable=False) is JobOutcome.WAIT and not tally.ranks_ended
    healthy = tally.with_verdict(SuspectVerdict.HEALTHY)
    assert healthy.outcome(relocatable=False) is JobOutcome.WAIT  # the total is not known yet
    done = FaultTally.from_item({**healthy.to_item(), "total": 1})
    assert done.all_decided and done.outcome(relocatable=False) is JobOutcome.RESTART
    reboot = done.with_verdict(SuspectVerdict.REBOOT, waits_for_reboot=True)
    assert reboot.outcome(relocatable=False) is JobOutcome.RESTART_AFTER_REBOOT and reboot.rebooting == 1
    fatal = reboot.with_verdict(SuspectVerdict.TIMEOUT)
    assert fatal.outcome(relocatable=True) is JobOutcome.RELOCATE
    assert fatal.outcome(relocatable=False) is JobOutcome.FAIL_NODE_FAULT
    assert FaultTally.from_item(fatal.to_item()) == fatal


def test_the_gcra_grants_the_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=40, burst=100)
    tat, now, granted = None, 1000.0, 0
    while True:
        decided = reserve(tat, now, 1, bucket)
        if not decided.granted:
            break
        tat, granted = decided.tat, granted + 1
    assert granted == 100 and decided.wait_seconds == pytest.approx(1 / 40)
    later = reserve(tat, now + 1.0, 40, bucket)  # a second later: 40 more
    assert later.granted and not reserve(later.tat, now + 1.0, 1, bucket).granted
    assert floor_seconds(2047) == pytest.approx((2047 - 100) / 40) and floor_seconds(50) == 0.0


def test_a_reservation_ahead_takes_the_next_token_and_says_when_it_is_due() -> None:
    bucket = TokenBucket(rate=10, burst=2)
    now = 1000.0
    first = reserve(None, now, 1, bucket, ahead=1.0)
    second = reserve(first.tat, now, 1, bucket, ahead=1.0)
    assert first.granted and second.granted and first.wait_seconds == second.wait_seconds == 0.0
    waits = []
    tat = second.tat
    for _ in range(10):  # then one every 0.1 s, in the order they were reserved
        decided = reserve(tat, now, 1, bucket, ahead=1.0)
        if not decided.granted:
            break
        tat = decided.tat
        waits.append(decided.wait_seconds)
    assert waits == pytest.approx([0.1 * i for i in range(1, 11)])
    refused = reserve(tat, now, 1, bucket, ahead=1.0)  # due in 1.1 s: too far off
    assert not refused.granted and refused.wait_seconds == pytest.approx(1.1) and refused.tat == tat
    # Without ``ahead`` nothing changes: a token not due now is refused.
    assert not reserve(second.tat, now, 1, bucket).granted


def test_identical_ranks_share_a_start_call_on_distinct_nodes_only() -> None:
    same = spec_key("td:1", {"containerOverrides": []}, "", 1, [{"key": "gpu-recovery:rank", "value": "3"}],
                    ["gpu-recovery:rank"])
    assert same == spec_key("td:1", {"containerOverrides": []}, "", 1,
                            [{"key": "gpu-recovery:rank", "value": "9"}], ["gpu-recovery:rank"])
    # 8 ranks per node (one per GPU) on 3 nodes: calls group one rank of each node.
    ranks = [PlannedRank(r, f"node-{r // 8}", same) for r in range(24)]
    calls = plan_calls(ranks)
    assert len(calls) == 8 and all(len(set(c.nodes)) == len(c.nodes) == 3 for c in calls)
    assert sorted(r for c in calls for r in c.ranks) == list(range(24))
    assert plan_calls(list(reversed(ranks))) == calls  # the same ranks, the same calls
    # Ranks of different specs never share one; at most 10 per call.
    mixed = [PlannedRank(r, f"n{r}", "a" if r % 2 else "b") for r in range(30)]
    assert all(len({m % 2 for m in c.ranks}) == 1 and len(c.ranks) <= 10 for c in plan_calls(mixed))
    assert all(len(c.ranks) == 1 for c in plan_calls(mixed, batching=False))
    assert parse_ranks_tag(ranks_tag_value([11, 3, 19])) == [3, 11, 19]


def _ecs_tag_value() -> tuple[object, int]:
    """The TagValue shape of the ECS model botocore ships: its pattern (whole) and its length."""
    import botocore.session
    import regex

    shape = botocore.session.get_session().get_service_model("ecs").shape_for("TagValue")
    return regex.compile(shape.metadata["pattern"]), int(shape.metadata["max"])


@pytest.mark.parametrize("gpus_per_node", [1, 8])
def test_the_ranks_tag_of_every_grouped_start_of_an_8192_task_job_is_an_ecs_tag_value(
        gpus_per_node: int) -> None:
    """Issue 40, defect 1: ECS tag values take no comma ("0,1,2" failed every grouped restart).
    Every call of the largest job (8,192 tasks, one per GPU or one per node) carries a value
    ECS takes, under 256 characters, that reads back as the call's ranks."""
    pattern, longest = _ecs_tag_value()
    ranks = [PlannedRank(r, f"node-{r // gpus_per_node}", "same") for r in range(8192)]
    calls = plan_calls(ranks)
    assert sum(len(c.ranks) for c in calls) == 8192
    for call in calls:
        value = ranks_tag_value(call.ranks)
        assert pattern.fullmatch(value) and len(value) <= longest, value  # type: ignore[attr-defined]
        assert parse_ranks_tag(value) == sorted(call.ranks)
    # The widest a call can be: ten scattered ranks of four digits.
    scattered = [8191 - 3 * i for i in range(10)]
    assert len(ranks_tag_value(scattered)) <= 49
    assert parse_ranks_tag(ranks_tag_value(scattered)) == sorted(scattered)


def test_the_ranks_tag_writes_runs_and_reads_back_what_it_wrote() -> None:
    assert ranks_tag_value([5, 0, 1, 2, 3, 9, 10]) == "0-3 5 9-10"
    assert ranks_tag_value([7]) == "7" and ranks_tag_value([2, 2, 3]) == "2-3"
    assert parse_ranks_tag("0-3 5 9-10") == [0, 1, 2, 3, 5, 9, 10]
    assert parse_ranks_tag("3,11,19") == [3, 11, 19]  # commas read as spaces
    assert parse_ranks_tag("x 4-2 7 -1 0-99999999") == [7]  # malformed parts are skipped
    with pytest.raises(ValueError, match="do not fit an ECS tag value"):
        ranks_tag_value(range(0, 1000, 2))  # never planned (a call has 10 ranks): refused, not sent


def test_gang_batches_cover_the_gang_and_refuse_malformed_bodies() -> None:
    work = batches(STOP, "job", 2, 8192, why="fault")
    assert work[0].first == 0 and work[-1].last == 8192 and len(work) == 82
    assert len(batches(START, "job", 3, 1024)) == 13
    body = work[5].body()
    assert GangBatch.from_body(body) == work[5]
    for bad in ({}, {**body, "op": "reboot"}, {**body, "first": 50, "last": 10}, {**body, "job_id": "a#b"},
                {**body, "attempt": "x"}, {**body, "last": body["first"] + 1000}):
        with pytest.raises(ValueError):
            GangBatch.from_body(bad)
