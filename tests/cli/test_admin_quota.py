"""``gpu-recovery-admin quota set|list|remove`` on the emulator's quota table (LocalAws: moto,
the table as the stack defines it), and what a user then sees through the jobs API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from cli import admin, gpujobs
from gpu_recovery import constants as C
from gpu_recovery.repository.time_sharing import QuotaRepository


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The emulator (it creates the quota table and sets $QUOTA_TABLE_NAME); default LOW = 16."""
    from local_mode.emulator import LocalAws

    monkeypatch.setattr(admin, "_caller", lambda: "oncall")
    monkeypatch.setenv(C.ENV_DEFAULT_NODE_QUOTAS, json.dumps({"LOW": 16}))
    with LocalAws(metrics_disabled=True) as emulator:
        yield emulator


def quotas(local: Any, table: str | None = None) -> QuotaRepository:
    return QuotaRepository(local.resource("dynamodb"), table or local.quota_table)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = admin.main(["quota", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()]


def test_set_list_and_remove(local: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Given the default LOW = 16 nodes,
    When an operator sets alice's HIGH quota (level in lower case) and bob's NORMAL one (by his
    IAM ARN, level by value), lists, lists alice's, then removes alice's and one never set,
    Then the items are stored under the user names with the operator as author; list shows the
    set rows and the defaults; alice's view has every level with its source; the remove
    brings back "no limit" (no HIGH default); removing what was never set exits 1."""
    code, out, err = run(capsys, "set", "--user", "alice", "--priority", "high", "--nodes", "8")
    assert code == 0, err
    row = json.loads(out)
    assert (row["user"], row["priority"], row["priority_name"], row["max_nodes"], row["source"]) == (
        "alice", 30, "HIGH", 8, "set")
    assert "quota set: alice may hold 8 node(s) at once at HIGH" in err
    stored = quotas(local).get("alice", 30)
    assert stored is not None and stored["max_nodes"] == 8 and stored["updated_by"] == "oncall"
    code, _, _ = run(capsys, "set", "--user", "arn:aws:iam::123456789012:user/bob", "--priority", "10",
                     "--nodes", "2")
    assert code == 0 and quotas(local).get("bob", 10)["max_nodes"] == 2

    code, out, err = run(capsys, "list")
    assert code == 0
    assert table(out) == [["USER", "PRIORITY", "LIMIT", "SOURCE", "IN", "USE", "ROOM"],
                          ["alice", "HIGH", "8", "set", "0", "8"],
                          ["bob", "NORMAL", "2", "set", "0", "2"]]
    assert "defaults ($DEFAULT_NODE_QUOTAS): LOW 16; other levels: no limit" in err
    code, out, _ = run(capsys, "list", "--json")
    assert json.loads(out)["defaults"] == {"LOW": 16} and len(json.loads(out)["quotas"]) == 2

    code, out, _ = run(capsys, "list", "--user", "alice")
    assert code == 0
    rows = {r[0]: r[1:] for r in table(out)[2:]}
    assert table(out)[0] == ["User:", "alice"]
    assert rows["HIGH"] == ["8", "set", "0", "8"] and rows["LOW"] == ["16", "default", "0", "16"]
    assert rows["NORMAL"] == ["unlimited", "unlimited", "0", "-"] and len(rows) == 7

    code, out, err = run(capsys, "remove", "--user", "alice", "--priority", "HIGH")
    assert code == 0
    assert json.loads(out) == {"user": "alice", "priority": 30, "priority_name": "HIGH", "removed": True,
                               "max_nodes": None, "source": "unlimited"}
    assert "quota removed: alice at HIGH now has no limit (unlimited)" in err
    assert "max_nodes" not in quotas(local).get("alice", 30)
    code, out, err = run(capsys, "remove", "--user", "dave", "--priority", "HIGH")
    assert code == 1 and json.loads(out)["removed"] is False
    assert "dave has no quota set at HIGH: nothing removed" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["set", "--user", "alice", "--priority", "URGENT", "--nodes", "1"],
     "error: --priority: must be one of LOW"),
    (["set", "--user", "alice", "--priority", "7", "--nodes", "1"],
     "error: --priority: must be one of LOW=0"),
    (["set", "--user", "alice", "--priority", "HIGH", "--nodes", "-1"],
     "error: --nodes: must be an integer 0..100000"),
    (["set", "--user", "alice", "--priority", "HIGH", "--nodes", "100001"],
     "error: --nodes: must be an integer"),
    (["set", "--user", "al#ice", "--priority", "HIGH", "--nodes", "1"],
     "error: --user: must not contain '#'"),
    (["remove", "--user", "alice", "--priority", "nope"], "error: --priority: must be one of"),
    (["list", "--user", "a#b"], "error: --user: must not contain '#'"),
])
def test_bad_input_names_the_option_and_exits_2(local: Any, capsys: pytest.CaptureFixture[str],
                                                argv: list[str], message: str) -> None:
    """A bad level, a negative or huge node count, a user with '#': exit 2, one line naming the
    option, nothing written."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(message), err
    assert quotas(local).page(10)[0] == []


def test_a_malformed_default_or_a_non_integer_is_a_usage_error(local: Any, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """$DEFAULT_NODE_QUOTAS that is not a JSON object of level -> nodes: exit 2 naming it;
    --nodes that is not an integer: argparse's usage error (exit 2) naming --nodes."""
    monkeypatch.setenv(C.ENV_DEFAULT_NODE_QUOTAS, '{"HIGH": -3}')
    code, _, err = run(capsys, "list")
    assert code == 2 and err.startswith("error: DEFAULT_NODE_QUOTAS: HIGH must be 0..100000 nodes")
    with pytest.raises(SystemExit) as usage:
        admin.main(["quota", "set", "--user", "a", "--priority", "HIGH", "--nodes", "many"])
    assert usage.value.code == 2
    assert "argument --nodes: invalid int value: 'many'" in capsys.readouterr().err


def test_quota_table_option_wins_over_the_environment(local: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Given a second quota table,
    When set runs with --quota-table naming it,
    Then the quota lands there and not in $QUOTA_TABLE_NAME's table; a table that does not
    exist is an error of the AWS call (exit 1, no traceback)."""
    client = local.client("dynamodb")
    client.create_table(TableName="other_quota", BillingMode="PAY_PER_REQUEST",
                        **C.table_definitions()["quota"])
    assert admin.main(["quota", "--quota-table", "other_quota", "set", "--user", "carol", "--priority", "LOW",
                       "--nodes", "3"]) == 0
    assert quotas(local, "other_quota").get("carol", 0)["max_nodes"] == 3
    assert quotas(local).get("carol", 0) is None
    capsys.readouterr()
    assert admin.main(["quota", "--quota-table", "missing", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ResourceNotFoundException") and "Traceback" not in err


def test_a_quota_set_by_the_operator_is_what_the_user_sees(local: Any, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the jobs API on 127.0.0.1 over the same tables,
    When the operator sets alice's HIGH quota with gpu-recovery-admin,
    Then `gpujobs quota` run by alice shows it as set, and LOW as the deployment's default."""
    from handlers import jobs_api
    from local_mode.server import LocalApi, LocalApiServer

    jobs_api.reset()
    try:
        with LocalApiServer(LocalApi()) as server:
            assert admin.main(["quota", "set", "--user", "alice", "--priority", "HIGH", "--nodes", "4"]) == 0
            capsys.readouterr()
            monkeypatch.setenv("USER", "alice")
            assert gpujobs.main(["--endpoint", server.url, "quota"]) == 0
            rows = {r[0]: r[1:] for r in table(capsys.readouterr().out)[2:]}
    finally:
        jobs_api.reset()
    assert rows["HIGH"] == ["4", "set", "0", "4"] and rows["LOW"] == ["16", "default", "0", "16"]
