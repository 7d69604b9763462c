"""``gpu-recovery-admin breaker show|reset``: the operator's view and reset of the
blast-radius breaker, on its DynamoDB item (moto)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from cli import admin
from gpu_recovery import constants as C
from gpu_recovery.domain.breaker import breaker
from gpu_recovery.repository import Repository

NOW = 1_800_000_000.0


@pytest.fixture
def repo(monkeypatch: pytest.MonkeyPatch) -> Iterator[Repository]:
    monkeypatch.setattr(admin, "_caller", lambda: "oncall")
    with mock_aws():
        ddb = boto3.resource("dynamodb", region_name="us-east-1")
        defs = C.table_definitions()
        for kind, name in (("job", "jobs"), ("instance", "instances")):
            ddb.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", **defs[kind])
        yield Repository(ddb, "jobs", "instances")


def _tripped(repo: Repository) -> None:
    """Four of ten nodes acted on: the 3rd trips (limit 2), the 4th joins the backlog."""
    policy = breaker.BreakerPolicy()
    state: dict[str, Any] | None = None
    for i, node in enumerate(["n1", "n2", "n3", "n4"]):
        decided = breaker.record_action(state, node=node, action="reboot", now=NOW + i, cluster_gpu_nodes=10,
                                        policy=policy, job_id=f"job-{i}", reason="XID 79")
        assert repo.breaker.save({**decided.state, "limit": decided.limit, "cluster_gpu_nodes": 10},
                                 None if state is None else state["version"])
        state = decided.state


def _run(repo: Repository, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    """The command with --json: its document."""
    code = admin.main(["breaker", argv[0], "--json", *argv[1:]], repo=repo)
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out.strip() else None, out.err


def test_show_a_tripped_breaker(repo: Repository, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    _tripped(repo)
    monkeypatch.setattr("time.time", lambda: NOW + 60)
    code, shown, _ = _run(repo, capsys, "show")
    assert code == 0
    assert shown["state"] == "tripped" and shown["trips"] == 1
    assert "3 of 10 GPU nodes" in shown["trip_reason"]
    assert shown["nodes_in_window"] == ["n1", "n2"] and shown["limit"] == 2
    assert [b["node"] for b in shown["backlog"]] == ["n3", "n4"]


def test_show_prints_for_people_by_default(repo: Repository, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a tripped breaker, When `breaker show` runs without --json, Then it prints
    labelled lines and a backlog table, times in UTC ISO 8601 with how long ago (no epoch
    seconds, no JSON)."""
    _tripped(repo)
    monkeypatch.setattr("time.time", lambda: NOW + 60)
    assert admin.main(["breaker", "show"], repo=repo) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == ("Breaker:       open until an operator resets it: n1 is gone (no item) after its "
                        "remediation, not back healthy")
    assert "Limit:         2 node action(s) per 10 min, 10 GPU nodes counted" in lines
    assert "In the window: n1, n2" in lines
    trips = "Trips:         1, last at 2027-01-15T08:00:02Z (58 s ago): "
    assert any(line.startswith(trips) for line in lines)
    assert lines[lines.index("Backlog (held-back node actions):") + 1].split() == [
        "NODE", "ACTION", "SINCE", "JOB", "REASON"]
    assert "  n3    reboot  2027-01-15T08:00:02Z (58 s ago)  job-2  XID 79" in lines
    assert "{" not in out and "1800000" not in out


def test_reset_resuming_the_backlog_releases_it_for_the_sweep(repo: Repository,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _tripped(repo)
    code, shown, err = _run(repo, capsys, "reset", "--resume-backlog")
    assert code == 0 and shown["state"] == "closed"
    assert [e["node"] for e in shown["released"]] == ["n3", "n4"]
    assert "carries them out within a minute" in err
    stored = repo.breaker.read()
    assert stored["state"] == "closed" and stored["backlog"] == [] and stored["last_reset_by"] == "oncall"
    assert sorted(stored["released"]) == ["n3", "n4"]  # the recovery sweep's to carry out


def test_reset_dropping_the_backlog_releases_nothing(repo: Repository,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _tripped(repo)
    code, shown, err = _run(repo, capsys, "reset", "--drop-backlog")
    assert code == 0 and shown["released"] == [] and len(shown["dropped"]) == 2
    assert not repo.breaker.read().get("released")
    assert "dropped" in err


def test_reset_needs_a_choice(repo: Repository) -> None:
    with pytest.raises(SystemExit):
        admin.main(["breaker", "reset"], repo=repo)


def test_show_before_any_node_action(repo: Repository, capsys: pytest.CaptureFixture[str]) -> None:
    code, shown, err = _run(repo, capsys, "show")
    assert code == 0 and shown["state"] == "closed" and "never acted" in err


def test_show_says_when_the_cluster_was_not_counted(repo: Repository, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Given one node action (the breaker needed no cluster count), Then show prints
    cluster_gpu_nodes null and says why, instead of a count of 0."""
    decided = breaker.record_action(None, node="n1", action="reboot", now=NOW, cluster_gpu_nodes=0)
    assert repo.breaker.save({**decided.state, "limit": decided.limit}, None)
    monkeypatch.setattr("time.time", lambda: NOW + 60)
    code, shown, err = _run(repo, capsys, "show")
    assert code == 0 and shown["cluster_gpu_nodes"] is None and shown["nodes_in_window"] == ["n1"]
    assert "not counted yet" in err


def test_the_region_comes_from_aws_region_as_well(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell that exports AWS_REGION only (as docs/playground.md once had it): the admin
    commands use it, rather than failing with botocore's NoRegionError (botocore itself reads
    AWS_DEFAULT_REGION only); --region still wins."""
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    args = admin.build_parser().parse_args(["breaker", "show"])
    assert admin.Context(args).boto_session().region_name == "eu-west-1"
    args = admin.build_parser().parse_args(["--region", "us-west-2", "breaker", "show"])
    assert admin.Context(args).boto_session().region_name == "us-west-2"
