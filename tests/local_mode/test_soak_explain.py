"""``python -m local_mode.soak --explain JOB`` (local_mode/soak.py): a job's history with the
stack's own log records that name it, on stderr; a job the soak never had is said to be so.
``--against RATE``: the jobs the stack failed beyond a baseline run's, listed and explained."""

from __future__ import annotations

import contextlib
import io

import pytest

from local_mode import soak


def test_an_explained_job_shows_its_history_and_the_stacks_log_records_naming_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Given a small soak (four nodes, one job, no call failing), When soak-000 and a job it
    never had are explained, Then soak-000's state, its history and the stack's records of its
    ranks' registration are printed, and the other is named as no such job."""
    with contextlib.redirect_stdout(io.StringIO()):
        result = soak.run_soak(seed=5, nodes=4, jobs=1, hours=1.5, settle_hours=1.0, rate=0.0,
                               flaps_per_minute=0.0, explain=["soak-000", "soak-999"])
    explained = capsys.readouterr().err
    assert result.problems == []
    job = explained.split("=== soak-999")[0]
    assert job.startswith("=== soak-000: COMPLETE") or job.startswith("=== soak-000: FAILED"), job[:300]
    assert "-> RUNNING" in job  # its history
    logged = [line for line in job.splitlines() if line.startswith("  log ")]
    registered = [line for line in logged if "rank registered" in line]
    assert registered and all('"job_id": "soak-000"' in line for line in registered)
    assert "=== soak-999: no such job" in explained


def test_without_explain_the_stacks_log_is_not_kept() -> None:
    """The records are kept only for ``--explain`` (a soak without it keeps its memory flat)."""
    with soak._stack_log(sim=None, wanted=False) as kept:  # type: ignore[arg-type]
        assert kept is None


@pytest.mark.parametrize("baseline_failed", [set(), {"soak-000"}])
def test_a_job_the_stack_failed_beyond_the_baseline_is_listed_and_explained(
        baseline_failed: set[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Given one non-relocatable job whose node's GPU dies (DCGM: replace; no spare: the stack
    fails it and e-mails), When the run is compared with a baseline (``--against``) that did not
    fail it, Then it is listed beyond the baseline and explained; compared with one that failed
    it too, it is not."""
    with contextlib.redirect_stdout(io.StringIO()):
        result = soak.run_soak(seed=3, nodes=4, jobs=1, hours=1.5, settle_hours=1.0, rate=0.0,
                               flaps_per_minute=0.0, fault_share=1.0, baseline_failed=baseline_failed)
    explained = capsys.readouterr().err
    assert result.failed_by_the_stack == ["soak-000"] and result.problems == []
    if baseline_failed:
        assert result.failed_beyond_baseline == [] and "=== soak-000" not in explained
    else:
        assert result.failed_beyond_baseline == ["soak-000"]
        assert explained.startswith("=== soak-000: FAILED") and "  log " in explained
        assert result.as_dict()["failed_beyond_baseline"] == ["soak-000"]


class _Jobs:
    """The one read ``_failed_by_repeat_faults`` makes of the jobs table."""

    def __init__(self, item: dict[str, object]) -> None:
        self.item = item

    def get_job_item(self, job_id: str) -> dict[str, object]:
        return self.item


@pytest.mark.parametrize(("faults", "error", "by_repeats"), [
    (3, "has a GPU fault a reboot cannot fix (catalog rule 'dcgm-verdict-reboot')", True),
    (2, "has a GPU fault a reboot cannot fix (catalog rule 'dcgm-verdict-reboot')", False),
    (3, "restart failed: no healthy nodes", False),
])
def test_a_job_failed_beyond_the_baseline_by_its_nodes_repeat_faults_is_told_apart(
        faults: int, error: str, by_repeats: bool) -> None:
    """Given a node the soak gave ``faults`` reboot-fixable GPU faults (the escalation allows 2
    reboots for one cause, then replaces), When a job failed on it with ``error``, Then it is a
    failure by repeat faults (the policy, not a lead) only for a third fault and a node to
    replace."""
    with soak._world(2, "memory") as world:
        sim = world.ecs
        node = sorted(sim.nodes.values(), key=lambda n: n.name)[0]
        for i in range(faults):
            sim.inject_gpu_fault(node.name, after=60 + 600 * i, health="reboot_fixable")
        sim.run_for(60 + 600 * faults)
        item = {"last_error": f"{node.container_instance_id} {error}", "history": [{"at": sim.now()}]}
        repo = type("Repo", (), {"jobs": _Jobs(item)})()
        assert soak._failed_by_repeat_faults(repo, sim, "soak-000") is by_repeats  # type: ignore[arg-type]
