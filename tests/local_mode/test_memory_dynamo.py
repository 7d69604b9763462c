"""MemoryDynamo against moto: the same Repository intents and raw calls on both give the
same results and leave the same items; plus the DynamoDB semantics MemoryDynamo adds
(exact item-size limit, transaction conflicts, metering, DynamoDB's paging)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any
from unittest.mock import patch

import pytest
from boto3.dynamodb.conditions import Key
from botocore.exceptions import ClientError, ParamValidationError

from gpu_recovery import clock
from gpu_recovery import constants as C
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.models import Instance, Job, Rank
from gpu_recovery.domain.rate_limit import TokenBucket
from gpu_recovery.domain.shards import stable_shard
from gpu_recovery.domain.states import InstanceState, JobState, RankState
from gpu_recovery.repository import RankStop, Repository, health_check_slots
from gpu_recovery.repository.claim_fields import HEALTH_CHECK as CHECK_CLAIM
from gpu_recovery.repository.rate_limit import RateLimitRepository
from local_mode.emulator import LocalAws
from local_mode.sim.dynamo import MAX_ITEM_BYTES, MemoryDynamo, item_size

JOBS, INSTANCES, QUOTAS = C.DEFAULT_JOB_TABLE_NAME, C.DEFAULT_INSTANCE_TABLE_NAME, C.DEFAULT_QUOTA_TABLE_NAME
T0 = 1_800_000_000.0


def _outcome(fn: Callable[[], Any]) -> Any:
    """What a call gave: its value, or its error code (and cancellation reason codes)."""
    try:
        value = fn()
    except ClientError as error:
        reasons = [r.get("Code") for r in error.response.get("CancellationReasons") or []]
        return ("error", error.response["Error"]["Code"], reasons, error.response.get("Item"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list):
        return [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value]
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "ResponseMetadata"}
    return value


def _rank(rank: int, *, attempt: int = 1, state: RankState = RankState.RUNNING) -> Rank:
    return Rank(job_id="j1", rank=rank, state=state, attempt=attempt,
                task_arn=f"arn:aws:ecs:us-east-1:123456789012:task/c/j1-a{attempt}-r{rank}",
                task_definition_arn="arn:aws:ecs:us-east-1:123456789012:task-definition/train:1",
                container_inst_id=f"n{rank}", container_instance_arn=f"arn:ci/n{rank}",
                ec2_instance_id=f"i-{rank:04d}", tags=[{"key": C.TAG_JOB_ID, "value": "j1"}],
                started_by="launcher", registered_at=T0, gpus=8)


def _pages(table: Any, **query: Any) -> list[list[dict[str, Any]]]:
    """Every page of a Query (boto3 resource Table)."""
    pages = []
    while True:
        response = table.query(**query)
        pages.append(response.get("Items", []))
        if "LastEvaluatedKey" not in response:
            return pages
        query["ExclusiveStartKey"] = response["LastEvaluatedKey"]


def scenario(ddb: Any) -> list[tuple[str, Any]]:
    # A claim token's random part, the same in both runs.
    counter = itertools.count()
    with patch.object(health_check_slots, "_nonce", lambda: f"{next(counter):08x}"):
        return _scenario(ddb)


def _scenario(ddb: Any) -> list[tuple[str, Any]]:
    """The same sequence on any boto3-shaped DynamoDB resource; what each step gave."""
    now = [T0]
    clock.set_clock(lambda: now[0])
    repo = Repository(ddb, JOBS, INSTANCES)
    seen: list[tuple[str, Any]] = []

    def step(label: str, fn: Callable[[], Any]) -> Any:
        result = _outcome(fn)
        seen.append((label, result))
        now[0] += 1.5
        return result

    try:
        # Registration: instances, job, ranks; duplicates lose their condition.
        for n in range(4):
            step(f"instance {n}", lambda n=n: repo.instances.put_instance_if_absent(
                Instance(f"n{n}", container_instance_arn=f"arn:ci/n{n}", ec2_instance_id=f"i-{n:04d}")))
        step("instance again", lambda: repo.instances.put_instance_if_absent(Instance("n0")))
        job = Job(job_id="j1", state=JobState.RUNNING, world_size=4, attempt=1, max_recovery_attempts=3,
                  created_at=T0, updated_at=T0)
        step("job", lambda: repo.registrations.create_job_if_absent(job))
        step("job again", lambda: repo.registrations.create_job_if_absent(job))
        for r in range(4):
            step(f"rank {r}", lambda r=r: repo.registrations.put_rank_registration(_rank(r)))
        step("rank 2 again", lambda: repo.registrations.put_rank_registration(_rank(2)))
        step("get_ranks", lambda: repo.jobs.get_ranks(job))
        step("by task", lambda: repo.registrations.look_up_task(_rank(3).task_arn))
        step("by task, unknown", lambda: repo.registrations.look_up_task("arn:unknown"))
        step("live on n1", lambda: repo.jobs.live_ranks_on_instance("n1"))
        step("mark running (not STARTING)", lambda: repo.rank_events.mark_running(_rank(1)))
        # A fault: node n0's suspect item (idempotent), then the job enters recovery with rank
        # 0's stop, atomically; a duplicate loses.
        faults = repo.faults
        record = {"at": T0, "evidence": {"exit_code": 1}, "plan": {"action": "health_check"}}
        step("open suspect n0", lambda: faults.open_suspect("j1", 1, "n0", rank=0, record=record, now=now[0],
                                                            retry_at=now[0] + 60))
        step("open suspect n0 again", lambda: faults.open_suspect("j1", 1, "n0", rank=0, record={"x": 1},
                                                                  now=now[0], retry_at=now[0] + 60))
        rank0 = repo.jobs.get_rank("j1", 0)
        assert rank0 is not None
        stop0 = RankStop(rank0, RankState.FAILED, {"exit_code": 1, "stop_reason": "exit 1"})
        step("enter recovery", lambda: repo.rank_events.enter_recovery(
            "j1", 1, from_states=[JobState.RUNNING], reason="rank 0 exited 1", now=now[0],
            deadline_at=now[0] + 60, rank_stop=stop0))
        step("enter recovery again", lambda: repo.rank_events.enter_recovery(
            "j1", 1, from_states=[JobState.RUNNING], reason="dup", now=now[0],
            deadline_at=now[0] + 60, rank_stop=stop0))
        rank1 = repo.jobs.get_rank("j1", 1)
        assert rank1 is not None
        step("open suspect n1", lambda: faults.open_suspect("j1", 1, "n1", rank=1, record={"at": now[0]},
                                                            now=now[0], retry_at=now[0] + 60))
        step("rank 1 stopped", lambda: repo.rank_events.record_stop(
            RankStop(rank1, RankState.FAILED, {"exit_code": 1})))
        step("rank 1 stopped again", lambda: repo.rank_events.record_stop(
            RankStop(rank1, RankState.FAILED, {})))
        step("suspects by index", lambda: faults.suspects("j1", 1))
        step("suspects, limit 1", lambda: faults.suspects("j1", 1, limit=1))
        step("health check requested", lambda: faults.health_check_requested(
            faults.get_suspect("j1", 1, "n0")))
        step("health check requested again", lambda: faults.health_check_requested(
            faults.get_suspect("j1", 1, "n0")))
        # Rank latches: sets on shard items, the head when a shard completes.
        for r in range(4):
            step(f"latch rank {r}", lambda r=r: sorted(x.value for x in repo.latches.arrive(
                "j1", 1, 4, r, [Latch.ENDED], suspect_node=f"n{r}" if r < 2 else "").complete))
        step("latch again", lambda: sorted(x.value for x in repo.latches.arrive(
            "j1", 1, 4, 3, [Latch.ENDED]).complete))
        step("latches complete", lambda: sorted(x.value for x in repo.latches.complete("j1", 1, 4)))
        step("latch suspects", lambda: sorted(repo.latches.suspect_nodes("j1", 1, 4)))
        # The ECS budget item (GCRA): granted, then refused with a wait.
        budget = RateLimitRepository(repo.tables)
        bucket = TokenBucket(rate=10.0, burst=5)
        at = now[0]
        step("budget 5", lambda: budget.reserve(5, bucket, at))
        step("budget 1 more", lambda: budget.reserve(1, bucket, at))
        # In turn (ahead): moved by atomic ADDs while within reach, then refused with a wait.
        step("budget in turn", lambda: budget.reserve(1, bucket, at, 0.25))
        step("budget in turn 2", lambda: budget.reserve(2, bucket, at, 0.25))
        step("budget in turn, too far", lambda: budget.reserve(1, bucket, at, 0.25))
        step("budget in turn, later", lambda: budget.reserve(1, bucket, at + 60, 0.25))
        step("budget in turn, again", lambda: budget.reserve(1, bucket, at + 60, 0.25))
        step("budget after turns", lambda: budget.reserve(1, bucket, at + 60.05))
        step("budget after turns, again", lambda: budget.reserve(1, bucket, at + 60.05))
        fresh = RateLimitRepository(repo.tables, "RATE#test-fresh")
        step("budget in turn, fresh item", lambda: fresh.reserve(3, bucket, at, 1.0))
        step("stop rank 3", lambda: repo.jobs.request_rank_stop(_rank(3), "restart", now[0]))
        step("stop rank 3 again", lambda: repo.jobs.request_rank_stop(_rank(3), "restart", now[0]))
        step("job", lambda: repo.jobs.get_job("j1"))
        step("job item", lambda: repo.jobs.get_job_item("j1"))
        # Health checks on the instance items, with the cluster's and the job's slots.
        step("open hc", lambda: repo.health_checks.open("n0", "j1", now=now[0], retry_at=now[0] + 60))
        step("open hc again", lambda: repo.health_checks.open("n0", "j1", now=now[0], retry_at=now[0] + 60))
        step("join hc", lambda: repo.health_checks.join("n0", "j9"))
        step("open hc unknown node", lambda: repo.health_checks.open("n7", "j1", now=now[0],
                                                                    retry_at=now[0] + 30))
        step("open hc n1", lambda: repo.health_checks.open("n1", "j1", now=now[0], retry_at=now[0] + 60))
        n0 = repo.instances.get_instance("n0")
        assert n0 is not None
        # A cluster limit of 2 (two shards of one slot): n0's shard is shard 0, the one shard of
        # a limit of 1 (the cluster-full step below).
        assert stable_shard("n0", 2) == 0
        step("claim hc", lambda: repo.health_checks.claim(n0, "sb-1", now[0] + 75, owner="j1", per_job=1,
                                                         cluster=2, now=now[0]).outcome.value)
        # (Raced: with room on the slot items; a full share answers before the instance is tried.)
        step("claim hc again", lambda: repo.health_checks.claim(
            n0, "sb-1", now[0] + 75, owner="j1", per_job=4, cluster=5, now=now[0]).outcome.value)
        n1 = repo.instances.get_instance("n1")
        assert n1 is not None
        step("claim hc, job full", lambda: repo.health_checks.claim(
            n1, "sb-3", now[0] + 75, owner="j1", per_job=1, cluster=5, now=now[0]).outcome.value)
        step("claim hc, cluster full", lambda: repo.health_checks.claim(
            n1, "sb-3", now[0] + 75, owner="j1", per_job=9, cluster=1,
            now=now[0]).outcome.value)
        step("wait for a slot", lambda: repo.health_checks.wait_for_slot(n1, "j1", now[0]))
        step("waiting", lambda: repo.slots.waiting("j1", 10))
        step("running", lambda: repo.slots.running())
        # The reaper: a token its instance holds is never reaped; one nobody holds is, once old.
        step("reap, held", lambda: repo.slots.reap(now[0] + 7200))
        step("orphan token", lambda: repo.slots._hold(
            C.DEFAULT_INSTANCE_TABLE_NAME, {C.INSTANCE_PK: C.health_check_slot_shard_key(1)},
            f"n1|{int(now[0])}|ffffffff|j1", 9, {}))
        step("reap, young", lambda: repo.slots.reap(now[0] + 60))
        step("reap, old", lambda: repo.slots.reap(now[0] + 7200))
        step("running after reaping", lambda: repo.slots.running_by_shard())
        step("take over hc claim, leased", lambda: repo.node_tasks.take_over(
            CHECK_CLAIM, repo.instances.get_instance("n0"), now[0], now[0] + 75, "tok-1"))
        step("take over hc claim, lease ended", lambda: repo.node_tasks.take_over(
            CHECK_CLAIM, repo.instances.get_instance("n0"), now[0] + 100, now[0] + 175, "tok-2"))
        step("record hc task", lambda: repo.node_tasks.record(
            CHECK_CLAIM, repo.instances.get_instance("n0"), "sb-1", "arn:hc-task", now[0] + 300))
        step("record hc task, other claim", lambda: repo.node_tasks.record(
            CHECK_CLAIM, repo.instances.get_instance("n0"), "sb-2", "x", now[0]))
        step("take over hc claim, recorded", lambda: repo.node_tasks.take_over(
            CHECK_CLAIM, repo.instances.get_instance("n0"), now[0] + 1000, now[0] + 1075, "tok-3"))
        step("instances", lambda: repo.instances.get_instances(["n0", "n1", "n7", "n9"]))
        step("due instances", lambda: repo.deadlines.due_instances(now[0] + 3600))
        step("due instances, none yet", lambda: repo.deadlines.due_instances(T0))
        step("due jobs", lambda: repo.deadlines.due_job_items(now[0] + 3600))
        step("due jobs, one page of 1", lambda: repo.deadlines.due_job_items(now[0] + 3600, limit=1))
        # A transaction whose second update fails: nothing is written.
        db, nodes = repo.tables.db, repo.instances
        step("transaction cancelled", lambda: db.transact([
            nodes.instance_update("n1", from_states=[InstanceState.AVAILABLE], set_fields={"mark": "x"}),
            nodes.instance_update("n2", from_states=[InstanceState.QUARANTINED], set_fields={"mark": "y"})]))
        step("transaction", lambda: db.transact([
            nodes.instance_update("n1", from_states=[InstanceState.AVAILABLE], set_fields={"mark": "x"},
                                  increments={"count": 2}, add_to_sets={"tags": {"a", "b"}}),
            nodes.instance_update("n2", from_states=[InstanceState.AVAILABLE],
                                  remove_fields=["ec2_instance_id"], deadline_at=now[0] + 10)]))
        step("delete from set", lambda: db.apply(nodes.instance_update(
            "n1", delete_from_sets={"tags": {"a"}}, increments={"count": -1})))
        step("apply returning", lambda: db.apply_returning(nodes.instance_update(
            "n3", set_fields={"nested": {"a": [1, 2, {"b": Decimal("2.5")}], "s": {"x"}}})))
        step("apply returning, condition fails", lambda: db.apply_returning(nodes.instance_update(
            "n3", from_states=[InstanceState.REBOOTING], set_fields={"z": 1})))
        # The restart: PENDING_RESTART, the claim (once), rank launch leases.
        step("to pending restart", lambda: repo.tables.db.apply(repo.jobs.job_transition(
            "j1", JobState.PENDING_RESTART, from_states=[JobState.PENDING_HEALTHCHECK], attempt=1,
            reason="verdicts in", actor="test", set_fields={"fault.reboot": 1},
            remove_fields=["stop_fanout"])))
        pending = repo.jobs.get_job("j1")
        assert pending is not None
        step("claim restart", lambda: repo.restarts.claim(pending, now=now[0], deadline_at=now[0] + 60))
        step("claim restart again", lambda: repo.restarts.claim(pending, now=now[0], deadline_at=now[0] + 60))
        launches = repo.fanouts
        step("claim launch", lambda: launches.claim_rank_launch(_rank(2), 2, now[0] + 75, now[0]))
        step("claim launch again", lambda: launches.claim_rank_launch(_rank(2), 2, now[0] + 75, now[0]))
        step("claim launch after lease", lambda: launches.claim_rank_launch(_rank(2), 2, now[0] + 200,
                                                                            now[0] + 100))
        step("register attempt 2", lambda: repo.registrations.put_rank_registration(
            _rank(2, attempt=2, state=RankState.STARTING)))
        step("confirm running", lambda: repo.restarts.confirm_running("j1", 2, "all running"))
        # Item size: an update that would pass 400 KB is refused, the item unchanged.
        step("too large",
             lambda: db.apply(nodes.instance_update("n3", set_fields={"blob": "x" * 450_000})))
        # Raw calls: paging through indexes, both orders, COUNT, ranges, ReturnValues.
        jobs = ddb.Table(JOBS)
        step("by-job-id pages", lambda: [i for page in _pages(
            jobs, IndexName=C.JOB_BY_JOB_INDEX, KeyConditionExpression=Key(C.JOB_BY_JOB_PK).eq("j1"), Limit=2)
            for i in page])
        step("by-job-id backwards", lambda: jobs.query(
            IndexName=C.JOB_BY_JOB_INDEX, KeyConditionExpression="#j = :j AND begins_with(#k, :p)",
            ExpressionAttributeNames={"#j": C.JOB_BY_JOB_PK, "#k": C.JOB_BY_JOB_SK},
            ExpressionAttributeValues={":j": "j1", ":p": "j1#"}, ScanIndexForward=False)["Items"])
        step("count", lambda: {k: v for k, v in jobs.query(
            IndexName=C.JOB_BY_JOB_INDEX, KeyConditionExpression=Key(C.JOB_BY_JOB_PK).eq("j1"),
            Select="COUNT").items() if k in ("Count", "ScannedCount")})
        quotas = ddb.Table(QUOTAS)
        bucket = Key(C.QUOTA_PK).eq(C.QUOTA_BUCKET)
        for user, level in (("alice", 100), ("alice", 300), ("bob", 200), ("alice", 200)):
            step(f"quota {user}", lambda u=user, lv=level: quotas.put_item(Item={
                C.QUOTA_PK: C.QUOTA_BUCKET, C.QUOTA_SK: f"{u}#{lv:03d}", "max_nodes": lv // 100}) and None)
        step("quota begins_with", lambda: quotas.query(
            KeyConditionExpression=bucket & Key(C.QUOTA_SK).begins_with("alice#"))["Items"])
        step("quota between, backwards", lambda: quotas.query(
            KeyConditionExpression=bucket & Key(C.QUOTA_SK).between("alice#150", "bob#999"),
            ScanIndexForward=False)["Items"])
        step("quota greater", lambda: quotas.query(
            KeyConditionExpression=bucket & Key(C.QUOTA_SK).gt("alice#200"))["Items"])
        step("updated new", lambda: quotas.update_item(
            Key={C.QUOTA_PK: C.QUOTA_BUCKET, C.QUOTA_SK: "bob#200"},
            UpdateExpression="SET used = if_not_exists(used, :z) + :one, note = :n",
            ExpressionAttributeValues={":z": 0, ":one": 1, ":n": "hi"},
            ReturnValues="UPDATED_NEW")["Attributes"])
        step("updated old", lambda: quotas.update_item(
            Key={C.QUOTA_PK: C.QUOTA_BUCKET, C.QUOTA_SK: "bob#200"},
            UpdateExpression="SET used = used + :one",
            ExpressionAttributeValues={":one": 1}, ReturnValues="UPDATED_OLD")["Attributes"])
        step("delete, condition fails with old item", lambda: quotas.delete_item(
            Key={C.QUOTA_PK: C.QUOTA_BUCKET, C.QUOTA_SK: "bob#200"}, ConditionExpression="used > :m",
            ExpressionAttributeValues={":m": 10}, ReturnValuesOnConditionCheckFailure="ALL_OLD"))
        step("delete", lambda: quotas.delete_item(
            Key={C.QUOTA_PK: C.QUOTA_BUCKET, C.QUOTA_SK: "alice#300"}, ReturnValues="ALL_OLD")["Attributes"])
        step("get missing", lambda: quotas.get_item(Key={C.QUOTA_PK: C.QUOTA_BUCKET, C.QUOTA_SK: "nobody"}))
        step("bad key", lambda: quotas.get_item(Key={C.QUOTA_PK: C.QUOTA_BUCKET}))
        step("consistent read on a GSI", lambda: jobs.query(
            IndexName=C.JOB_BY_JOB_INDEX, KeyConditionExpression=Key(C.JOB_BY_JOB_PK).eq("j1"),
            ConsistentRead=True))
        step("unused name", lambda: jobs.update_item(
            Key={C.JOB_PK: "j1#JOB"}, UpdateExpression="SET a = :a", ExpressionAttributeValues={":a": 1},
            ExpressionAttributeNames={"#unused": "x"}))
        step("update the key", lambda: jobs.update_item(
            Key={C.JOB_PK: "j1#JOB"}, UpdateExpression="SET #k = :a", ExpressionAttributeValues={":a": "x"},
            ExpressionAttributeNames={"#k": C.JOB_PK}))
        step("cancellation reasons", lambda: ddb.meta.client.transact_write_items(TransactItems=[
            {"Update": {"TableName": INSTANCES, "Key": {C.INSTANCE_PK: "n1"},
                        "UpdateExpression": "SET a = :a", "ExpressionAttributeValues": {":a": 1}}},
            {"ConditionCheck": {"TableName": INSTANCES, "Key": {C.INSTANCE_PK: "n2"},
                                "ConditionExpression": "attribute_not_exists(#k)",
                                "ExpressionAttributeNames": {"#k": C.INSTANCE_PK}}}]))
        step("same item twice in a transaction", lambda: repo.tables.db.transact([
            repo.instances.instance_update("n1", set_fields={"a": 1}),
            repo.instances.instance_update("n1", set_fields={"b": 1})]))
    finally:
        clock.reset_clock()
    return seen


def _table_items(scan: Callable[[str], Iterator[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {name: sorted(scan(name), key=lambda i: (str(i.get(C.JOB_PK, "")), str(i.get(C.INSTANCE_PK, "")),
                                                     str(i.get(C.QUOTA_SK, ""))))
            for name in (JOBS, INSTANCES, QUOTAS)}


def test_the_same_repository_intents_give_the_same_results_and_items_on_moto_and_memory_dynamo() -> None:
    with LocalAws() as local:
        resource = local.resource("dynamodb")
        on_moto = scenario(resource)

        def moto_scan(name: str) -> Iterator[dict[str, Any]]:
            table = resource.Table(name)
            response = table.scan()
            yield from response["Items"]
            while "LastEvaluatedKey" in response:
                response = table.scan(ExclusiveStartKey=response["LastEvaluatedKey"])
                yield from response["Items"]

        moto_items = _table_items(moto_scan)
    memory = MemoryDynamo({JOBS: "job", INSTANCES: "instance", QUOTAS: "quota"})
    in_memory = scenario(memory)
    memory_items = _table_items(memory.scan_all)

    assert [label for label, _ in on_moto] == [label for label, _ in in_memory]
    differences = [(label, moto, mine) for (label, moto), (_, mine) in zip(on_moto, in_memory, strict=True)
                   if moto != mine]
    assert differences == []
    for table in (JOBS, INSTANCES, QUOTAS):
        assert len(moto_items[table]) == len(memory_items[table]), table
        for moto_item, memory_item in zip(moto_items[table], memory_items[table], strict=True):
            assert moto_item == memory_item
    # The steps say what they should (not only "both alike").
    results = dict(in_memory)
    assert results["enter recovery"] is True and results["enter recovery again"] is False
    assert results["transaction cancelled"] is False
    assert results["cancellation reasons"][1:3] == ("TransactionCanceledException",
                                                    ["None", "ConditionalCheckFailed"])
    assert results["too large"][:2] == ("error", "ValidationException")
    assert results["delete, condition fails with old item"][1] == "ConditionalCheckFailedException"
    assert results["delete, condition fails with old item"][3]["used"] == {"N": "2"}
    assert results["same item twice in a transaction"][1] == "ValidationException"
    assert results["consistent read on a GSI"][1] == "ValidationException"
    # the job item, 4 rank items and 2 suspect items, 2 per page
    assert len(results["by-job-id pages"]) == 7
    assert [s["node"] for s in results["suspects by index"]] == ["n0", "n1"]
    assert results["open suspect n0 again"]["record"] == results["open suspect n0"]["record"]
    assert (results["health check requested"], results["health check requested again"]) == (True, False)
    assert results["latch rank 2"] == [] and results["latch rank 3"] == ["end"]
    assert results["latch suspects"] == ["n0", "n1"]
    assert results["budget 5"]["granted"] is True and results["budget 1 more"]["granted"] is False
    claims = ("claim hc", "claim hc again", "claim hc, job full", "claim hc, cluster full")
    assert [results[k] for k in claims] == ["claimed", "raced", "job_full", "cluster_full"]
    assert results["waiting"] == ["n1"] and results["running"] == 1
    reaped = ("reap, held", "reap, young", "reap, old")
    assert [results[k] for k in reaped] == [0, 0, 1]
    assert sum(results["running after reaping"].values()) == 1  # n0's, still held


# ============================================================== DynamoDB semantics
def _memory(**kwargs: Any) -> MemoryDynamo:
    return MemoryDynamo({JOBS: "job", INSTANCES: "instance"}, **kwargs)


def test_the_400_kb_limit_counts_names_and_values_by_dynamodb_rules() -> None:
    ddb = _memory()
    table = ddb.Table(INSTANCES)
    base = {C.INSTANCE_PK: "n1", "pad": ""}
    overhead = len(C.INSTANCE_PK) + len("n1") + len("pad")
    table.put_item(Item={**base, "pad": "x" * (MAX_ITEM_BYTES - overhead)})  # exactly 400 KB
    assert ddb.item_bytes(INSTANCES)[f"{INSTANCES}:n1"] == MAX_ITEM_BYTES
    with pytest.raises(ClientError) as error:
        table.put_item(Item={**base, "pad": "x" * (MAX_ITEM_BYTES - overhead + 1)})
    assert error.value.response["Error"] == {"Code": "ValidationException",
                                             "Message": "Item size has exceeded the maximum allowed size"}
    # Numbers: 1 byte per two significant digits + 1; lists and maps: 3 + 1 per element.
    from moto.dynamodb.models.dynamo_type import DynamoType

    attrs = {"n": DynamoType({"N": "12345"}), "l": DynamoType({"L": [{"S": "ab"}, {"BOOL": True}]}),
             "m": DynamoType({"M": {"k": {"NULL": True}}})}
    assert item_size(attrs) == (1 + 3 + 1) + (1 + 3 + (1 + 2) + (1 + 1)) + (1 + 3 + (1 + 1 + 1))


def test_an_index_key_of_the_wrong_type_is_refused() -> None:
    """DynamoDB checks GSI key types on every write (moto stores the string)."""
    table = _memory().Table(JOBS)
    with pytest.raises(ClientError) as error:
        table.put_item(Item={C.JOB_PK: "j1#JOB", C.DEADLINE_PK: C.DEADLINE_BUCKET, C.DEADLINE_SK: "soon"})
    assert error.value.response["Error"]["Code"] == "ValidationException"
    message = error.value.response["Error"]["Message"]
    assert "Type mismatch for Index Key deadline_at Expected: N Actual: S" in message


def test_transactions_of_different_invocations_on_one_item_conflict_within_the_window() -> None:
    # Raw calls: the Repository retries contention itself (with_contention_retries).
    now, who = [100.0], ["a"]
    ddb = _memory(context=lambda: ("fn", who[0]), now=lambda: now[0], tx_conflict_window=0.03)
    repo = Repository(ddb, JOBS, INSTANCES)
    for n in ("n1", "n2"):
        repo.instances.put_instance_if_absent(Instance(n))

    def both() -> bool:
        ddb.meta.client.transact_write_items(TransactItems=[
            repo.instances.instance_update(n, set_fields={"x": who[0]}).transact_item()
            for n in ("n1", "n2")])
        return True

    assert both()
    who[0], now[0] = "b", 100.01
    with pytest.raises(ClientError) as error:
        both()
    assert error.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert [r["Code"] for r in error.value.response["CancellationReasons"]] == ["TransactionConflict"] * 2
    with pytest.raises(ClientError) as single:  # a plain write to an item in a transaction
        ddb.Table(INSTANCES).update_item(Key={C.INSTANCE_PK: "n1"}, UpdateExpression="SET y = :one",
                                         ExpressionAttributeValues={":one": 1})
    assert single.value.response["Error"]["Code"] == "TransactionConflictException"
    who[0] = "a"
    assert both()  # the same invocation never conflicts with itself
    who[0], now[0] = "b", 100.05
    assert both()  # the window passed
    assert ddb.meter.total.conflicts == 3
    assert ddb.peek(INSTANCES, {C.INSTANCE_PK: "n1"})["x"] == "b"  # type: ignore[index]


def test_the_repository_retries_a_conflicting_transaction_after_the_window() -> None:
    now, who = [100.0], ["a"]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    ddb = _memory(context=lambda: ("fn", who[0]), now=lambda: now[0], tx_conflict_window=0.03)
    repo = Repository(ddb, JOBS, INSTANCES)
    clock.set_clock(lambda: now[0], sleep)
    try:
        for n in ("n1", "n2"):
            repo.instances.put_instance_if_absent(Instance(n))
        updates = [repo.instances.instance_update(n, set_fields={"x": 1}) for n in ("n1", "n2")]
        assert repo.tables.db.transact(updates)
        who[0] = "b"
        assert repo.tables.db.transact(updates)  # conflicted, waited, written
        assert ddb.meter.total.conflicts >= 1 and now[0] > 100.0
    finally:
        clock.reset_clock()


def test_metering_counts_keys_requested_units_and_transactions_twice() -> None:
    ddb = _memory(context=lambda: ("ecs_task_handler", "inv-1"))
    repo = Repository(ddb, JOBS, INSTANCES)
    repo.instances.put_instance_if_absent(Instance("n1"))
    ddb.meter.reset()
    assert repo.instances.get_instances(["n1", "n2", "n3"]).keys() == {"n1"}
    usage = ddb.meter.by_label["ecs_task_handler"]
    assert (usage.items_read, usage.read_units, usage.calls["BatchGetItem"]) == (3, 3.0, 1)
    ddb.Table(INSTANCES).put_item(Item={C.INSTANCE_PK: "big", "pad": "x" * 5000})
    ddb.meter.reset()
    assert repo.tables.db.transact([repo.instances.instance_update("n1", set_fields={"a": 1}),
                                    repo.instances.instance_update("big", set_fields={"a": 1})])
    usage = ddb.meter.total
    assert usage.items_written == 2
    assert usage.write_units == 2 * 1 + 2 * 5  # 1 KB rounded up, twice in a transaction
    assert usage.largest_item_bytes > 5000 and usage.largest_item == f"{INSTANCES}:big"
    ddb.meter.reset()
    assert repo.instances.get_instance("missing") is None  # a missing item still costs a read
    assert (ddb.meter.total.items_read, ddb.meter.total.read_units) == (1, 1.0)


def test_a_page_stops_at_limit_with_a_last_evaluated_key_as_dynamodb_does() -> None:
    ddb = _memory()
    table = ddb.Table(JOBS)
    for r in range(3):
        table.put_item(Item={C.JOB_PK: f"j#{r}", C.JOB_BY_JOB_PK: "j"})
    first = table.query(IndexName=C.JOB_BY_JOB_INDEX, KeyConditionExpression=Key(C.JOB_BY_JOB_PK).eq("j"),
                        Limit=3)
    assert len(first["Items"]) == 3 and first["LastEvaluatedKey"] == {C.JOB_PK: "j#2", C.JOB_BY_JOB_PK: "j"}
    rest = table.query(IndexName=C.JOB_BY_JOB_INDEX, KeyConditionExpression=Key(C.JOB_BY_JOB_PK).eq("j"),
                       ExclusiveStartKey=first["LastEvaluatedKey"])
    assert rest["Items"] == [] and "LastEvaluatedKey" not in rest


def test_boto3_type_rules_hold_floats_refused_and_bad_parameters_rejected() -> None:
    table = _memory().Table(INSTANCES)
    with pytest.raises(TypeError, match="Float types are not supported"):
        table.put_item(Item={C.INSTANCE_PK: "n1", "x": 1.5})
    with pytest.raises(ParamValidationError):
        table.put_item(Itm={C.INSTANCE_PK: "n1"})
    table.put_item(Item={C.INSTANCE_PK: "n1", "s": {"a", "b"}, "n": Decimal("1.5"), "b": b"\x00"})
    item = table.get_item(Key={C.INSTANCE_PK: "n1"})["Item"]
    assert item["s"] == {"a", "b"} and item["n"] == Decimal("1.5") and item["b"].value == b"\x00"
    item["s"].add("c")  # the caller's copy: the table is unchanged
    assert table.get_item(Key={C.INSTANCE_PK: "n1"})["Item"]["s"] == {"a", "b"}


@pytest.mark.parametrize("store", ["moto", "memory"])
def test_a_comparison_with_a_missing_attribute_is_false_and_not_equal_is_true_as_dynamodb_compares(
        store: str) -> None:
    """DynamoDB compares types first: a missing attribute is equal to nothing, a NULL value
    included, and not equal to anything (moto's own rule let ``missing = :null`` hold)."""
    def outcomes(table: Any) -> list[bool]:
        table.put_item(Item={C.INSTANCE_PK: "n0", "validation": {"since": 1}})
        results = []
        for condition, value in (("#v.#sb = :x", None), ("#v.#sb = :x", "claim-1"), ("#v.#sb <> :x", None),
                                 ("#v.#sb <> :x", "claim-1"), ("#v.#si = :x", 1), ("#v.#si <> :x", None)):
            try:
                table.update_item(Key={C.INSTANCE_PK: "n0"}, UpdateExpression="SET #m = :m",
                                  ConditionExpression=condition,
                                  ExpressionAttributeNames={"#v": "validation", "#m": "mark", **(
                                      {"#sb": "started_by"} if "#sb" in condition else {"#si": "since"})},
                                  ExpressionAttributeValues={":x": value, ":m": 1})
                results.append(True)
            except ClientError as error:
                assert error.response["Error"]["Code"] == "ConditionalCheckFailedException"
                results.append(False)
        return results

    expected = [False, False, True, True, True, True]
    if store == "memory":
        assert outcomes(_memory().Table(INSTANCES)) == expected
    else:
        with LocalAws() as local:
            assert outcomes(local.resource("dynamodb").Table(INSTANCES)) == expected
