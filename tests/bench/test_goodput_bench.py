"""``make bench BENCH=goodput`` at a small size (3 simulated days): the model's invariants."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.goodput_bench import Model, run, scenarios, simulate

SEEDS = range(20)


def test_the_bench_runs_small_and_prints_every_scenario(capsys) -> None:
    out = run(base=Model(days=3), with_storm=False, seeds=3)
    printed = capsys.readouterr().out
    for label in ("no spares (today's path)", "2 % spares", "5 % spares"):
        assert label in printed and 0 < out[label]["effective_training_time_ratio"] <= 1
    assert out["2 % spares"]["spares"] == 3 and out["5 % spares"]["spares"] == 7


@pytest.mark.parametrize("seed", SEEDS)
def test_ratios_are_in_0_1_and_the_books_balance(seed) -> None:
    for label, model in scenarios(Model(days=3, seed=seed)):
        r = simulate(model, label)
        assert 0 < r.ratio <= 1
        assert r.productive_seconds + r.lost_seconds <= r.wall_seconds
        assert len(r.recover_seconds) <= r.interruptions <= r.faults
        assert all(s >= model.restart_seconds for s in r.recover_seconds)
        if model.spares == 0:
            assert r.relocations == 0


def test_spares_are_not_worse_than_none_for_the_same_seed() -> None:
    """Per seed within 0.5 percentage point (after a relocation the job runs on other nodes,
    so it meets other faults), and better on average; the same seed is reproducible."""
    gains = []
    for seed in SEEDS:
        none, two, five, *_ = (simulate(m).ratio for _, m in scenarios(Model(days=3, seed=seed)))
        assert two >= none - 0.005 and five >= none - 0.005
        gains.append(five - none)
    assert sum(gains) / len(gains) > 0
    model = Model(days=3, seed=7, spare_nodes="5%")
    assert simulate(model).as_dict() == simulate(replace(model)).as_dict()


def test_a_faultless_run_trains_all_the_time() -> None:
    r = simulate(Model(days=3, failures_per_1000_node_days=0.0 + 1e-12))
    assert r.faults == 0 and r.ratio == 1.0
