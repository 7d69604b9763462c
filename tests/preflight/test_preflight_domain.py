"""The gang preflight's policy (pure): the real ``all_reduce_perf`` output parsed as it is,
a run judged on its large sizes' busbw, the baseline learned from passing runs, the pinning
search's rounds and pins, and when an attempt runs the preflight."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from gpu_recovery.domain.preflight import baseline as bl
from gpu_recovery.domain.preflight import pinning
from gpu_recovery.domain.preflight.judge import FAILED, HUNG, PASSED, SLOW, hung, judge
from gpu_recovery.domain.preflight.mode import PreflightMode, required
from gpu_recovery.domain.preflight.nccl_output import parse_all_reduce_perf, table_lines
from gpu_recovery.domain.preflight.pinning import Fault, simulate

REAL = Path(__file__).parent / "fixtures" / "real" / "nccl_all_reduce_perf_2x8_h100.txt"
CAPTURE = REAL.read_text()


# ------------------------------------------------------------------ the real output
def test_the_real_two_node_h100_run_parses_as_printed() -> None:
    run = parse_all_reduce_perf(CAPTURE)
    assert len(run.rows) == 31 and run.rows[0].size_bytes == 8 and run.rows[-1].size_bytes == 8589934592
    assert run.ranks == 16 and run.hosts == ("ztan-mig-235z", "ztan-mig-gq73")
    assert run.devices == ("NVIDIA H100 80GB HBM3",)
    assert run.out_of_bounds == 0 and run.wrong_values == 0 and not run.errors
    big = run.rows[-1]
    assert (big.oop_busbw, big.ip_busbw, big.oop_wrong, big.ip_wrong) == (338.82, 337.35, 0, 0)
    # The closing mean covers the small sizes too: never the judged figure.
    assert run.avg_busbw == pytest.approx(70.742)
    assert run.large_busbw()[134217728] == pytest.approx(153.04)  # SOURCES.md: 152 GB/s at 128 MB
    assert run.judged_busbw() == pytest.approx(338.085)  # 339 GB/s at 8 GB
    assert run.failure(0) == ""


def test_a_run_fails_on_wrong_values_bounds_errors_exit_code_or_no_large_size() -> None:
    # Each variant changes one thing of the real text (named in its line).
    wrong = CAPTURE.replace("338.82      0", "338.82      3")  # the 8 GB out-of-place #wrong
    assert "3 wrong value(s)" in parse_all_reduce_perf(wrong).failure(0)
    bounds = CAPTURE.replace("Out of bounds values : 0 OK", "Out of bounds values : 3 FAILED")
    assert parse_all_reduce_perf(bounds).failure(0) == "out of bounds values: 3"
    cut = "\n".join(CAPTURE.splitlines()[:40])  # killed before the large sizes
    assert "no message size" in parse_all_reduce_perf(cut).failure(0)
    error = CAPTURE + "\nztan-mig-235z: Test NCCL failure common.cu:1005 'unhandled system error'\n"
    assert "Test NCCL failure" in parse_all_reduce_perf(error).failure(0)
    assert parse_all_reduce_perf(CAPTURE).failure(1) == "all_reduce_perf exited 1"
    no_check = CAPTURE.replace("      0\n", "    N/A\n")  # -c 0: no validation, N/A columns
    unchecked = parse_all_reduce_perf(no_check)
    assert unchecked.failure(0) == "" and unchecked.rows[-1].ip_wrong is None


def test_log_prefixes_and_nccl_chatter_are_read_through() -> None:
    prefixed = "\n".join(f"[rank 0] {line}" for line in CAPTURE.splitlines())
    noisy = "host:123:456 [0] NCCL INFO Bootstrap : Using eth0\n" + prefixed
    run = parse_all_reduce_perf(noisy)
    assert len(run.rows) == 31 and run.judged_busbw() == pytest.approx(338.085)
    kept = table_lines(noisy, max_lines=30)
    assert "NCCL INFO" not in kept and len(kept.splitlines()) == 30
    assert parse_all_reduce_perf(kept).judged_busbw() == pytest.approx(338.085)


def test_the_judgement_uses_the_threshold_and_names_failures() -> None:
    passed = judge(CAPTURE, 0, bl.Threshold(270.0, "learned"))
    assert passed.outcome == PASSED and passed.busbw == pytest.approx(338.085)
    slow = judge(CAPTURE, 0, bl.Threshold(400.0, "operator floor 400 GB/s"))
    assert slow.outcome == SLOW and "under 400.0 GB/s" in slow.reason
    assert judge(CAPTURE, 0, bl.Threshold(None, "first run")).outcome == PASSED
    assert judge(CAPTURE, 2, bl.Threshold(None, "")).outcome == FAILED
    assert hung(bl.Threshold(None, ""), 300).outcome == HUNG
    again = type(slow).from_dict(slow.to_dict())
    assert again.outcome == SLOW and again.busbw == pytest.approx(338.08, abs=0.01)


# ------------------------------------------------------------------ the baseline
def test_first_runs_then_the_median_and_a_slow_run_is_never_learned() -> None:
    policy = bl.BaselinePolicy()
    b = bl.Baseline("p5.48xlarge", 16)
    # Nothing learned: the first runs are held to 0.2 x the physical bound (p5: 400 GB/s EFA x 1.25).
    assert bl.threshold(policy, b, 16).gbps == pytest.approx(100.0)
    assert bl.threshold(policy, bl.Baseline("8gpu", 16), 16).gbps is None  # unknown class: failures only
    early = bl.learn(b, 120.0, "job-a#1")  # an early run over a degraded link: learned...
    assert early is not None and bl.learn(early, 120.0, "job-a#1") is None  # ...once
    b = early
    assert bl.threshold(policy, b, 16).gbps == pytest.approx(100.0)  # first runs: still the bound's
    for i, value in enumerate((330.0, 338.0)):
        b = bl.learn(b, value, f"job-b#{i}") or b
    t = bl.threshold(policy, b, 16)  # 3 samples: 0.8 x median(120, 330, 338)
    assert t.gbps == pytest.approx(264.0) and "median" in t.source
    assert t.slow(120.0) and not t.slow(300.0)
    for i in range(10):
        b = bl.learn(b, 335.0, f"job-c#{i}") or b
    assert len(b.samples) == bl.MAX_SAMPLES and 120.0 not in b.samples  # the item does not grow


def taught(klass: str, nodes: int, runs: dict[str, list[float]]) -> bl.Baseline:
    """A baseline as these users' passing runs taught it (in turn, each run learned)."""
    b = bl.Baseline(klass, nodes)
    for user, values in runs.items():
        for i, value in enumerate(values):
            b = bl.learn(b, value, f"{user}-job#{i}", user=user) or b
    return b


def test_an_operator_floor_bounds_the_threshold_and_sizes_borrow_the_nearest_learned() -> None:
    policy = bl.BaselinePolicy(floors={"p5.48xlarge": 250.0})
    learned = taught("p5.48xlarge", 16, {"ann": [300.0], "bob": [310.0], "cat": [320.0]})
    assert bl.threshold(policy, learned, 16).gbps == pytest.approx(250.0)  # 0.8 x 310 = 248 < floor
    assert bl.with_floor(policy, "p5.48xlarge", 4, {}).gbps == pytest.approx(250.0)  # never learned
    by_size = {16: learned, 8: taught("p5.48xlarge", 8, {"ann": [330.0]})}
    borrowed = bl.reference_for(by_size, 8, bl.BaselinePolicy())
    assert borrowed is learned  # 8 has too few runs: the larger job's reference
    assert bl.reference_for(by_size, 1, bl.BaselinePolicy()) is None  # a loopback borrows from nobody
    young = {4: taught("p5.48xlarge", 4, {"ann": [300.0]}), 16: bl.Baseline("p5.48xlarge", 16)}
    first = bl.reference_for(young, 16, bl.BaselinePolicy())  # a young fleet: another size's first runs
    assert first is young[4] and bl.threshold(bl.BaselinePolicy(), first, 16).gbps == pytest.approx(100.0)
    assert bl.node_class("", 8) == "8gpu" and bl.node_class("p5.48xlarge", 8) == "p5.48xlarge"
    with pytest.raises(ValueError):
        bl.BaselinePolicy(slow_fraction=0)
    with pytest.raises(ValueError):
        bl.BaselinePolicy(min_users=0)


def test_a_forged_table_is_not_learned_and_does_not_make_an_honest_run_slow() -> None:
    """Issue 49: a tenant posts busbw x1000 (or x2 once the fleet has a median)."""
    policy = bl.BaselinePolicy()
    for klass in ("p5.48xlarge", "8gpu"):
        fresh = bl.Baseline(klass, 2)
        assert bl.learn(fresh, 299_000.0, "forger#1") is None  # above the physical bound
        assert "physical bound" in bl.refusal(fresh, 299_000.0, policy)
        assert not bl.threshold(policy, fresh, 2).slow(299.0)
    # A forged first sample within the bound is learned but judges nobody alone.
    forged = bl.learn(bl.Baseline("p5.48xlarge", 2), 490.0, "forger#1", user="mallory")
    assert forged is not None and not bl.threshold(policy, forged, 2, "ann").slow(299.0)
    honest = taught("p5.48xlarge", 2, {"ann": [299.0], "bob": [301.0], "cat": [300.0]})
    assert bl.learn(honest, 490.0, "forger#2") is None and "median" in bl.refusal(honest, 490.0, policy)
    # Honest users outvote one forged sample: the median is theirs.
    b = forged
    for user in ("ann", "bob"):
        b = bl.learn(b, 300.0, f"{user}#1", user=user) or b
    judged = bl.threshold(policy, b, 2, "dan")
    assert judged.gbps == pytest.approx(240.0) and not judged.slow(299.0)


def test_one_user_forging_many_runs_does_not_move_what_others_are_judged_by() -> None:
    """Issue 49 (the audit): three forged 500 GB/s runs for 2 x p5 raised everyone's threshold
    from 232 to 400 GB/s, and twelve ratcheted it there from eight honest runs at 290."""
    policy = bl.BaselinePolicy()
    b = taught("p5.48xlarge", 2, {"mallory": [500.0] * 3})
    assert bl.threshold(policy, b, 2, "ann").gbps == pytest.approx(100.0)  # the hardware judges ann
    assert not bl.threshold(policy, b, 2, "ann").slow(290.0)
    assert bl.threshold(policy, b, 2, "mallory").gbps == pytest.approx(400.0)  # her runs judge her
    # Eight honest runs by three users, then twelve forged ones just under 1.5 x the median.
    b = taught("p5.48xlarge", 2, {"ann": [290.0, 291.0, 289.0], "bob": [290.0, 292.0, 288.0],
                                  "cat": [290.0, 290.0]})
    for i in range(12):
        b = bl.learn(b, min(500.0, 1.49 * (b.reference("mallory", policy) or bl.Reference(0.0, "")).median),
                     f"forged#{i}", policy, user="mallory") or b
    for user in ("ann", "dan"):  # dan: a first-time user, judged by the fleet
        judged = bl.threshold(policy, b, 2, user)
        assert judged.gbps == pytest.approx(232.0) and not judged.slow(290.0) and judged.slow(150.0)
    # Honest users teach as before, whatever the forger posted first.
    b = taught("p5.48xlarge", 2, {"mallory": [500.0] * 3, "ann": [300.0], "bob": [290.0], "cat": [280.0]})
    judged = bl.threshold(policy, b, 2, "dan")  # 0.8 x median(500, 300, 290, 280)
    assert judged.gbps == pytest.approx(236.0) and "median of 4 users' medians" in judged.source


def test_the_item_is_bounded_in_users_and_runs_and_the_old_shape_is_read_then_rewritten() -> None:
    b = taught("p5.48xlarge", 2, {f"user-{u}": [290.0 + u % 5] * 20 for u in range(40)})
    assert len(b.users) == bl.MAX_USERS and all(len(r.samples) == bl.MAX_SAMPLES for r in b.users.values())
    assert len(str(b.to_item())) < 12_000  # a few KB, whatever the number of users or runs
    assert bl.Baseline.from_item(b.to_item(), "p5.48xlarge", 2) == b
    # Before issue 49's per-user runs: whose samples they were is unknown (maybe a forgery).
    old = bl.Baseline.from_item({"samples": [500.0] * 8, "sample_ids": [f"j{i}#1" for i in range(8)],
                                 "version": 8}, "p5.48xlarge", 2)
    assert not old.taught and bl.threshold(bl.BaselinePolicy(), old, 2, "ann").gbps == pytest.approx(100.0)
    again = bl.learn(old, 290.0, "ann-job#1", user="ann")
    assert again is not None and again.version == 9 and "samples" not in again.to_item()


def test_the_physical_bounds_name_their_source() -> None:
    from gpu_recovery.domain.preflight.bounds import GENERIC, max_busbw

    assert max_busbw("p5.48xlarge", 1).gbps == 900.0 and "NVLink" in max_busbw("p5.48xlarge", 1).source
    p4d = max_busbw("p4d.24xlarge", 4)
    assert p4d.gbps == pytest.approx(62.5) and "EFA" in p4d.source
    assert max_busbw("8gpu", 2).known is False and max_busbw("8gpu", 1).gbps == GENERIC.nvlink_gbps


# ------------------------------------------------------------------ pinning
def _bound_node(n: int) -> int:
    return math.ceil(math.log2(n)) + 1


@pytest.mark.parametrize("n", [4, 5, 8, 13, 16])
def test_a_node_path_or_a_same_half_link_is_pinned_within_log2_n_plus_one_rounds(n: int) -> None:
    for x in range(n):
        sim = simulate(n, [Fault((x,))])
        assert sim.pinned == [x] and sim.rounds <= _bound_node(n), (x, sim)
    # a link whose ends share the half at every split: neighbours 2k, 2k+1 of a power of two
    if n & (n - 1) == 0:
        for a in range(0, n, 2):
            sim = simulate(n, [Fault((a, a + 1))])
            assert sim.pinned == [a, a + 1] and sim.rounds <= _bound_node(n)


@pytest.mark.parametrize("n", [3, 4, 7, 8, 16])
def test_every_link_is_pinned_to_its_two_ends_within_two_log2_n_rounds(n: int) -> None:
    worst = 0
    for a, b in itertools.combinations(range(n), 2):
        sim = simulate(n, [Fault((a, b))])
        assert sim.pinned == [a, b], (a, b, sim)  # both ends, no healthy node
        worst = max(worst, sim.rounds)
    assert worst <= 2 * math.ceil(math.log2(n))
    # ...and the tests of a round are disjoint groups
    state = pinning.after_first_round(n, gang_passed=False)
    while not state.done:
        tests = pinning.plan_round(state)
        used = [m for t in tests for m in pinning.members(t.nodes)]
        assert len(used) == len(set(used))
        state = pinning.advance(state, tests, {t.test_id: 0 not in pinning.members(t.nodes) for t in tests})


def test_four_nodes_cannot_tell_their_six_links_apart_in_three_rounds() -> None:
    """Why 2 ceil(log2 N) and not ceil(log2 N) + 1 for any link: after round 1, every way to
    split four nodes into disjoint groups leaves some outcome holding two or more links that
    the next round's one split cannot separate (checked over every partition)."""
    nodes = range(4)
    links = list(itertools.combinations(nodes, 2))

    def partitions(items: list[int]) -> list[list[list[int]]]:
        if not items:
            return [[]]
        head, rest = items[0], items[1:]
        out = []
        for part in partitions(rest):
            out.append([[head], *part])
            for i in range(len(part)):
                out.append([*part[:i], [head, *part[i]], *part[i + 1:]])
        return out

    def outcome(groups: list[list[int]], link: tuple[int, int]) -> int:
        return next((i for i, g in enumerate(groups) if set(link) <= set(g)), -1)

    def resolvable(candidates: list[tuple[int, int]], rounds: int) -> bool:
        if len(candidates) <= 1:
            return True
        if rounds == 0:
            return False
        for groups in partitions(list(nodes)):
            split: dict[int, list[tuple[int, int]]] = {}
            for link in candidates:
                split.setdefault(outcome(groups, link), []).append(link)
            if len(split) > 1 and all(resolvable(c, rounds - 1) for c in split.values()):
                return True
        return False

    assert not resolvable(links, 2)  # rounds 2 and 3
    assert resolvable(links, 3)  # rounds 2..4: what the search takes (2 ceil(log2 4) = 4)


def test_loopbacks_silence_two_nodes_and_widespread_faults() -> None:
    state = pinning.after_first_round(16, gang_passed=False, loopback_failed=[3], missing=[9])
    assert state.done and state.pinned_nodes == [3, 9]
    assert "loopback" in state.pinned[0].reason and "never reported" in state.pinned[1].reason
    two = pinning.after_first_round(2, gang_passed=False)
    assert two.pinned_nodes == [0, 1] and two.pinned[0].peer == 1  # nothing else to tell them apart
    many = pinning.after_first_round(64, gang_passed=False, loopback_failed=range(10))
    assert many.done and not many.pinned and "not a few nodes" in many.widespread
    fabric = simulate(32, [Fault((n,)) for n in range(0, 32, 4)])  # eight slow nodes: the fabric
    assert fabric.pinned == [] and fabric.widespread
    flapping = pinning.PinState(8, (pinning.Problem(pinning.CROSSX, (((0, 1),), ((6, 7),), ((1, 2),),
                                                                     ((4, 5),))),))
    tests = pinning.plan_round(flapping)
    after = pinning.advance(flapping, tests, {t.test_id: True for t in tests})
    assert after.done and not after.pinned and "nothing pinned" in after.notes[-1]
    assert pinning.PinState.from_dict(after.to_dict()) == after


def test_the_state_does_not_grow_with_the_job() -> None:
    state = pinning.after_first_round(1024, gang_passed=False)
    tests = pinning.plan_round(state)
    assert [pinning.describe(t.nodes) for t in tests] == ["0-511", "512-1023"]
    assert len(str([t.to_dict() for t in tests])) < 200


# ------------------------------------------------------------------ when it runs
def test_which_attempts_run_the_preflight() -> None:
    auto = PreflightMode.AUTO
    assert required(auto, nodes=16, min_nodes=8, first_start=False, recovery_restart=True)[0]
    assert not required(auto, nodes=4, min_nodes=8, first_start=False, recovery_restart=True)[0]
    assert not required(auto, nodes=16, min_nodes=0, first_start=False, recovery_restart=True)[0]
    assert not required(auto, nodes=16, min_nodes=8, first_start=True, recovery_restart=False)[0]
    assert required(PreflightMode.ALWAYS, nodes=2, min_nodes=8, first_start=True, recovery_restart=False)[0]
    assert not required(PreflightMode.RESTARTS, nodes=2, min_nodes=8, first_start=True,
                        recovery_restart=False)[0]
    assert not required(PreflightMode.OFF, nodes=64, min_nodes=8, first_start=False, recovery_restart=True)[0]
    assert not required(PreflightMode.ALWAYS, nodes=64, min_nodes=8, first_start=False,
                        recovery_restart=False)[0]  # a resume after a suspension
