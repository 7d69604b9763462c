"""Issue 49: the breaker (and the cordon limit) count nodes, not reports. A window whose
nodes were all condemned by one job's own evidence (its exit codes, its preflight) is not a
fleet event: the node past the limit is refused, the breaker does not trip (nothing held for
every other job); independent evidence (two jobs, or the stack's own findings) still trips
it as before."""

from __future__ import annotations

from gpu_recovery.domain import cordon
from gpu_recovery.domain.breaker import breaker
from gpu_recovery.domain.breaker.breaker import CLOSED, TRIPPED
from gpu_recovery.domain.breaker.causes import STACK, TENANT, cause_of, tenant_only
from gpu_recovery.domain.evidence import DcgmFindings, Evidence
from gpu_recovery.domain.fault_vocabulary import Trigger

T = 1_734_220_000.0
NODES = 10  # 20 %: two nodes a window


def _one_job(job: str) -> dict[str, str]:
    return cause_of(Evidence(node_id="n", fault_at=T, trigger=Trigger.PREFLIGHT, job_id=job), [job])


def _act(state, node: str, at: float, cause: dict[str, str] | None):
    return breaker.record_action(state, node=node, action="reboot", now=at, cluster_gpu_nodes=NODES,
                                 job_id="j", reason="r", cause=cause)


def test_one_job_condemning_ten_nodes_does_not_trip_the_breaker() -> None:
    state = breaker.new_state()
    allowed = []
    for n in range(10):
        decided = _act(state, f"node-{n}", T + n, _one_job("broken-image"))
        state = decided.state
        allowed.append(decided.allowed)
        assert not decided.tripped_now
    assert allowed == [True, True] + [False] * 8  # past the limit: refused, one by one
    assert state["state"] == CLOSED and state["trips"] == 0 and not state["backlog"]
    assert "one cause (job:broken-image)" in decided.reason
    assert {e["cause"] for e in state["window"]} == {"job:broken-image"}
    # Another job's real fault (the stack's DCGM verdict) is independent evidence: the
    # window now has two causes, and the limit trips the breaker as before.
    other = _act(state, "node-x", T + 20, {"source": STACK})
    assert other.tripped_now and other.state["state"] == TRIPPED


def test_two_jobs_evidence_past_the_limit_still_trips_it() -> None:
    state = breaker.new_state()
    for n, job in enumerate(("a", "b", "a")):
        decided = _act(state, f"node-{n}", T + n, _one_job(job))
        state = decided.state
    assert decided.tripped_now and state["state"] == TRIPPED


def test_stack_owned_findings_on_three_nodes_trip_it_as_before() -> None:
    state = breaker.new_state()
    for n in range(3):
        decided = _act(state, f"node-{n}", T + n, {"source": STACK})
        state = decided.state
    assert decided.tripped_now and state["state"] == TRIPPED


def test_the_cordon_limit_counts_causes_too() -> None:
    state = None
    for i, node in enumerate("abcdef"):
        decided = cordon.admit(state, node=node, now=100.0 + i, cluster_gpu_nodes=8, cause=_one_job("j"))
        state = decided.state
        assert not decided.tripped_now
    assert decided.limit == 4 and not decided.allowed and state["state"] == cordon.CLOSED
    assert [e["cause"] for e in state["window"]] == ["job:j"] * 4
    tripped = cordon.admit(state, node="g", now=110.0, cluster_gpu_nodes=8, cause={"source": STACK})
    assert tripped.tripped_now


def test_what_counts_as_a_jobs_own_evidence() -> None:
    exit_only = Evidence(node_id="n", fault_at=T, trigger=Trigger.TASK_EXIT, job_id="j", exit_code=1)
    assert tenant_only(exit_only) and cause_of(exit_only, ["j"]) == {"source": TENANT, "cause": "job:j"}
    dcgm = exit_only.with_dcgm(DcgmFindings.from_verdict_json({"verdict": "reboot"}, exit_code=1,
                                                              task_arn="t"), T)
    assert not tenant_only(dcgm) and cause_of(dcgm, ["j"]) == {"source": STACK}
    lost = Evidence(node_id="n", fault_at=T, trigger=Trigger.NODE_LOST, job_id="j")
    assert not tenant_only(lost)
