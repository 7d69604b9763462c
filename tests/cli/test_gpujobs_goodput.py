"""``gpujobs show``'s goodput ledger and ``gpujobs goodput`` (a user's jobs over a period),
against the fake jobs API of test_gpujobs_cli (the ledgers as the jobs API returns them)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from cli.gpujobs import clock as gpujobs_clock
from tests.cli import test_gpujobs_cli
from tests.cli.test_gpujobs_cli import FakeApi, run

# The fake jobs API and the CLI's environment of test_gpujobs_cli, as fixtures here too.
api = test_gpujobs_cli.api
_env = test_gpujobs_cli._env

NOW = 1_800_000_000.0


def ledger(**seconds: float) -> dict[str, Any]:
    wall = sum(seconds.values())
    own = sum(seconds.get(c, 0.0) for c in ("suspended", "preempted", "queued", "application_error"))
    ettr = seconds.get("productive", 0.0) / (wall - own)
    return {"wall_seconds": wall, "seconds": seconds, "ettr": ettr,
            "stack_share_seconds": seconds.get("detection", 0.0) + seconds.get("diagnosis", 0.0),
            "own_seconds": own, "faults": 1, "lost_work_unknown_faults": 0,
            "lost_work": seconds.get("lost_work", 0.0),
            "top_nodes": [{"name": "ci-7", "seconds": 900.0}],
            "top_rules": [{"name": "xid-79", "seconds": 900.0}]}


@pytest.fixture(autouse=True)
def _now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpujobs_clock, "utcnow", lambda: datetime.fromtimestamp(NOW, UTC))


def test_show_prints_the_jobs_ledger(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    """Given a job whose ledger has a fault (lost work, detection, diagnosis, repair) and a
    preemption, When `gpujobs show` runs, Then it prints ETTR, one row per cause with its
    share (the job's own marked) and the costliest node and fault; --json has the ledger."""
    api.add_job("ft-1", state="RUNNING", goodput=ledger(productive=8000, lost_work=600, detection=30,
                                                        diagnosis=120, repair=150, preempted=1100))
    assert run(api, "show", "ft-1") == 0
    out = capsys.readouterr().out
    assert "Goodput:    ETTR 89.9 % of 2:46:40 wall" in out
    assert "lost_work" in out and "0:10:00" in out and "preempted" in out and "the job's own" in out
    assert "costliest nodes: ci-7 0:15:00" in out and "costliest faults: xid-79" in out
    assert "validation" not in out  # no time: no row
    assert run(api, "show", "ft-1", "--json") == 0
    assert json.loads(capsys.readouterr().out)["goodput"]["seconds"]["repair"] == 150


def test_show_says_when_lost_work_is_unknown(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    book = {**ledger(productive=1000, diagnosis=60), "lost_work_unknown_faults": 1, "lost_work": "unknown"}
    api.add_job("ft-2", state="RUNNING", goodput=book)
    assert run(api, "show", "ft-2") == 0
    out = capsys.readouterr().out
    assert "unknown" in out and "no checkpoint reported" in out


def test_goodput_sums_a_users_recent_jobs_in_gpu_hours(api: FakeApi,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Given two of alice's jobs within the week (2x8 GPUs each) and one older, When
    `gpujobs goodput --since 7d --json` runs, Then it sums the two: GPU-hours per cause and the
    GPU-weighted ETTR; the table view prints the same."""
    api.add_job("a-1", state="COMPLETE", submitted_at=NOW - 3600,
                goodput=ledger(productive=3600, repair=1800))
    api.add_job("a-2", state="RUNNING", submitted_at=NOW - 86400,
                goodput=ledger(productive=1800, suspended=900))
    api.add_job("a-0", state="COMPLETE", submitted_at=NOW - 30 * 86400, goodput=ledger(productive=99_999))
    assert run(api, "goodput", "--since", "7d", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["jobs"] == 2
    assert summary["gpu_hours"] == {"productive": 24.0, "repair": 8.0, "suspended": 4.0}
    assert summary["ettr"] == pytest.approx(24 / 32)
    assert run(api, "goodput") == 0
    out = capsys.readouterr().out
    assert "2 job(s), 36.0 GPU-hours, ETTR 75.0 %" in out and "repair" in out


def test_goodput_refuses_a_bad_period(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(api, "goodput", "--since", "a week") == 2  # argparse's usage error
    assert "a period like 7d or 36h" in capsys.readouterr().err
    assert api.requests == []
