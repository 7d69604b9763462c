"""A restart that cannot be placed waits for its nodes (domain.restart_wait). Pure."""

from __future__ import annotations

from gpu_recovery.domain.restart_wait import RestartWait, blocked_by, is_placement_race


def test_startasks_race_reasons_are_placement_races_and_others_are_not() -> None:
    for reason in ("RESOURCE:GPU", "RESOURCE:MEMORY", "AGENT", "MISSING", ""):
        assert is_placement_race(reason), reason
    assert not is_placement_race("ATTRIBUTE")


def test_a_node_is_blocked_in_startasks_words() -> None:
    assert blocked_by(status=None, agent_connected=False, free_gpus=0, needed_gpus=8).startswith("MISSING")
    assert blocked_by(status="ACTIVE", agent_connected=False, free_gpus=8, needed_gpus=8).startswith("AGENT")
    assert blocked_by(status="DRAINING", agent_connected=True, free_gpus=8, needed_gpus=8) == \
        "RESOURCE: the container instance is DRAINING"
    assert blocked_by(status="ACTIVE", agent_connected=True, free_gpus=2, needed_gpus=8) == \
        "RESOURCE:GPU: 2 of the 8 GPUs it needs are free"
    assert blocked_by(status="ACTIVE", agent_connected=True, free_gpus=8, needed_gpus=8) == ""


def test_a_wait_is_of_one_attempt_says_which_nodes_and_why_and_ends_at_its_bound() -> None:
    wait = RestartWait.start(2, 1000.0, 1800, {"node-a": "RESOURCE:GPU: 0 of the 8 GPUs it needs are free, "
                                                         "held by task abc (group family:web, started by x)"})
    assert RestartWait.from_item(wait.to_item(), 2) == wait
    assert RestartWait.from_item(wait.to_item(), 3) is None  # an older attempt's
    assert "node-a: RESOURCE:GPU" in wait.waiting_reason() and "up to 1800 s" in wait.waiting_reason()
    assert not wait.expired(2799.0) and wait.expired(2800.0)
    assert wait.timeout_reason().startswith("restart could not be placed within 1800 s")
    assert "held by task abc" in wait.timeout_reason()


def test_a_wait_of_many_blocked_nodes_names_five_and_counts_the_rest_on_a_small_item() -> None:
    """A restart of an 8,192-rank job whose nodes are all blocked: its wait (on the job item)
    names the first five nodes with why and says how many there are; the item stays a few
    hundred bytes, and reads back equal (a wait written before the count reads as its names)."""
    blocked = {f"node-{i:05d}": "AGENT: its ECS agent is disconnected" for i in range(8192)}
    wait = RestartWait.start(2, 1000.0, 1800, blocked)
    assert [node for node, _ in wait.blocked] == [f"node-{i:05d}" for i in range(5)]
    assert wait.total == 8192 and len(str(wait.to_item())) < 1000
    assert RestartWait.from_item(wait.to_item(), 2) == wait
    assert wait.waiting_reason().endswith("node-00004: AGENT: its ECS agent is disconnected; "
                                          "and 8187 more node(s)")
    older = {"attempt": 2, "since": 1000.0, "until": 2800.0, "blocked": {"node-a": "MISSING"}}
    assert RestartWait.from_item(older, 2).total == 1  # type: ignore[union-attr]
    now = wait.now_blocked({"node-b": "MISSING: the container instance is gone"})
    assert now.total == 1 and now.since == wait.since and now.until == wait.until
    assert now.timeout_reason().endswith("node-b: MISSING: the container instance is gone")
