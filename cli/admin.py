"""``gpu-recovery-admin``: operator commands for a deployed stack.

    gpu-recovery-admin doctor [--stack-name GpuTrainingRecovery]   # is the account ready?
    gpu-recovery-admin issue-token --node-id <container-instance-id>   # prints the token once
    gpu-recovery-admin revoke-token --node-id <container-instance-id>
    gpu-recovery-admin list-tokens [--json]
    gpu-recovery-admin breaker show [--json]
    gpu-recovery-admin breaker reset --resume-backlog | --drop-backlog [--json]
    gpu-recovery-admin quota set --user alice --priority HIGH --nodes 8
    gpu-recovery-admin quota list [--user alice] [--json]
    gpu-recovery-admin quota remove --user alice --priority HIGH
    gpu-recovery-admin faults --job-id llama-ft-... [--attempt 1] [--json]   # every suspect node of a fault
    gpu-recovery-admin return-node --node-id <id> [--reason TEXT] [--without-check]   # see cli.admin_return
    gpu-recovery-admin inject-fault xid 79 --job <job id> --rank 1   # the local playground only

``breaker`` reads and writes the breaker's item in the container-instance table
(``--instance-table`` or ``$CONTAINER_INSTANCE_TABLE_NAME``). ``reset --resume-backlog``
releases the held-back node actions: the recovery sweep carries them out within a
minute (entries older than ``--max-backlog-age-hours``, default 24, are dropped: a stale
backlog is not replayed); ``--drop-backlog`` forgets them.

``faults`` lists every suspect node of a job's fault (its verdict, the catalog's decision,
the XIDs seen, the ranks that failed there) from the job table (``--job-table`` or
``$TRAINING_JOB_TABLE_NAME``): the recovery e-mails name a few nodes and count the rest.

``quota`` manages node quotas (the most nodes a user may hold at once at a priority level)
in the quota table (``--quota-table`` or ``$QUOTA_TABLE_NAME``), through the same service
as the jobs API's admin routes. A user is an IAM ARN or the name ``gpujobs quota`` shows
(IAM user name, or ``<role>/<session>``). ``list`` shows what applies: a level without a
set quota has the deployment's default, read from ``$DEFAULT_NODE_QUOTAS`` (the JSON the
stack gives the jobs API, e.g. ``{"HIGH": 8}``), else no limit. A change applies from the
scheduler's next tick. ``remove`` exits 1 when no quota was set at that level.

``inject-fault`` (old name ``fault``, deprecated) injects a fault into the local playground
(``make playground``) through its local-only route; it refuses any endpoint not on this
machine (see :mod:`cli.inject_fault`).

Credentials and region come from the usual AWS settings (``--region`` / ``--profile``
override them). Token commands use the table ``--table`` or ``$NODE_TOKEN_TABLE_NAME``
(the stack output ``NodeTokenTableName``). Only a token's SHA-256 hash is stored: a lost
token cannot be recovered, issue a new one (which also invalidates the old).

Reads print for people (labelled lines, tables, UTC times with how long ago); ``--json``
prints the document itself, for scripts.

Commands are a registry (``COMMANDS``): to add one, write ``add_arguments(parser)`` and
``run(args, ctx) -> exit status`` and append a :class:`Command`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cli import admin_goodput, admin_return, admin_views, doctor, inject_fault
from gpu_recovery.constants import (
    DEFAULT_INSTANCE_TABLE_NAME,
    DEFAULT_JOB_TABLE_NAME,
    DEFAULT_NODE_TOKEN_TABLE_NAME,
    DEFAULT_QUOTA_TABLE_NAME,
    ENV_DEFAULT_NODE_QUOTAS,
    ENV_INSTANCE_TABLE,
    ENV_JOB_TABLE,
    ENV_NODE_TOKEN_TABLE,
    ENV_QUOTA_TABLE,
)
from gpu_recovery.heartbeat.tokens import TokenError, TokenStore


@dataclass
class Context:
    """What a command may use; tests inject ``store`` / ``session``."""

    args: argparse.Namespace
    store: TokenStore | None = None
    session: Any = None
    repo: Any = None  # the recovery Repository (breaker commands)
    quotas: Any = None  # the QuotaService (quota commands)

    def boto_session(self) -> Any:
        if self.session is None:
            import boto3

            # AWS_REGION too (botocore reads only AWS_DEFAULT_REGION): the region the
            # playground and the SDKs' own docs export.
            self.session = boto3.session.Session(profile_name=self.args.profile,
                                                 region_name=self.args.region or os.environ.get("AWS_REGION"))
        return self.session

    def token_store(self) -> TokenStore:
        if self.store is None:
            table = self.args.table or os.environ.get(ENV_NODE_TOKEN_TABLE) or DEFAULT_NODE_TOKEN_TABLE_NAME
            self.store = TokenStore(self.boto_session().resource("dynamodb").Table(table))
        return self.store

    def repository(self) -> Any:
        if self.repo is None:
            from gpu_recovery.repository import Repository

            instances = (getattr(self.args, "instance_table", None) or os.environ.get(ENV_INSTANCE_TABLE)
                         or DEFAULT_INSTANCE_TABLE_NAME)
            jobs = (getattr(self.args, "job_table", None) or os.environ.get(ENV_JOB_TABLE)
                    or DEFAULT_JOB_TABLE_NAME)
            self.repo = Repository(self.boto_session().resource("dynamodb"), jobs, instances)
        return self.repo

    def quota_service(self) -> Any:
        if self.quotas is None:
            from gpu_recovery.queue.quotas import QuotaService
            from gpu_recovery.repository.time_sharing import QuotaRepository
            from gpu_recovery.settings import parse_node_quotas

            table = self.args.quota_table or os.environ.get(ENV_QUOTA_TABLE) or DEFAULT_QUOTA_TABLE_NAME
            defaults = parse_node_quotas(os.environ.get(ENV_DEFAULT_NODE_QUOTAS) or "")
            self.quotas = QuotaService(QuotaRepository(self.boto_session().resource("dynamodb"), table),
                                       defaults)
        return self.quotas


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Context], int]
    deprecated_aliases: tuple[str, ...] = ()  # old names still accepted, with a warning


def _caller() -> str:
    return os.environ.get("USER") or os.environ.get("USERNAME") or "gpu-recovery-admin"


def _node_id_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", required=True, help="ECS container instance id of the node")


def _issue_token(args: argparse.Namespace, ctx: Context) -> int:
    token = ctx.token_store().issue(args.node_id, issued_by=_caller())
    print(token)
    print(f"token issued for node {args.node_id}; it is shown only now. Put it in "
          "/etc/gpu-node-agent/token (mode 0600) or GPU_AGENT_TOKEN.", file=sys.stderr)
    return 0


def _revoke_token(args: argparse.Namespace, ctx: Context) -> int:
    if ctx.token_store().revoke(args.node_id, revoked_by=_caller()):
        print(f"token of node {args.node_id} revoked", file=sys.stderr)
        return 0
    print(f"node {args.node_id} has no token", file=sys.stderr)
    return 1


def _json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (for scripts)")


def _list_tokens(args: argparse.Namespace, ctx: Context) -> int:
    import time

    rows = ctx.token_store().list()
    if args.json:
        for row in rows:
            print(json.dumps(row, default=str, sort_keys=True))
        return 0
    for line in admin_views.token_lines(rows, time.time()):
        print(line)
    if not rows:
        print("no node token issued (gpu-recovery-admin issue-token --node-id <id>)", file=sys.stderr)
    return 0


def _doctor(args: argparse.Namespace, ctx: Context) -> int:
    return doctor.run(args, ctx.boto_session())


def _breaker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance-table", help=f"container-instance table (default ${ENV_INSTANCE_TABLE} "
                                                 f"or {DEFAULT_INSTANCE_TABLE_NAME})")
    actions = parser.add_subparsers(dest="breaker_command", required=True)
    show = actions.add_parser("show", help="state (closed / open, waiting to close by itself / open until "
                                           "an operator resets it) and why, nodes acted on in the window, "
                                           "backlog")
    _json_argument(show)
    reset = actions.add_parser("reset", help="close the breaker: resume or drop its backlog")
    _json_argument(reset)
    choice = reset.add_mutually_exclusive_group(required=True)
    choice.add_argument("--resume-backlog", action="store_true",
                        help="carry the held-back node actions out (the recovery sweep does it)")
    choice.add_argument("--drop-backlog", action="store_true", help="forget the held-back node actions")
    reset.add_argument("--max-backlog-age-hours", type=float, default=24.0,
                       help="with --resume-backlog: drop entries older than this (default 24)")


def _breaker(args: argparse.Namespace, ctx: Context) -> int:
    import time

    return breaker_command(args, ctx.repository(), time.time())


def breaker_command(args: argparse.Namespace, repo: Any, now: float) -> int:
    """``breaker show`` / ``breaker reset``: for people on stdout (``--json``: one JSON
    document), a sentence on stderr."""
    from gpu_recovery.domain import cordon as cordon_policy
    from gpu_recovery.domain.breaker import breaker as policy
    from gpu_recovery.recovery.breaker.operations import assess, reset_breaker
    from gpu_recovery.repository.scheduling import SchedulingRepository

    stored = repo.breaker.read()
    if args.breaker_command == "show":
        state = policy.normalize(stored)
        window_seconds = float((stored or {}).get("window_seconds") or 600)
        # The settings the breaker last decided with (recorded on its item by every decision).
        settings = policy.BreakerPolicy(window_seconds=window_seconds,
                                        auto_close=bool((stored or {}).get("auto_close", True)))
        answer = assess(repo.instances, stored, now=now, settings=settings)
        in_window = sorted({e["node"] for e in state["window"] if now - window_seconds < e["at"] <= now})
        tripped = state["state"] == policy.TRIPPED
        shown = {"state": state["state"], "standing": answer.standing, "why": answer.reason,
                 "nodes_acted_on_when_tripped": list(answer.nodes) if tripped else [],
                 "trips": state["trips"], "tripped_at": state["tripped_at"],
                 "trip_reason": state["trip_reason"], "nodes_in_window": in_window,
                 "limit": (stored or {}).get("limit"),
                 "cluster_gpu_nodes": (stored or {}).get("cluster_gpu_nodes"),
                 "window_seconds": window_seconds, "backlog": state["backlog"],
                 "released_not_yet_carried_out": sorted(((stored or {}).get("released") or {}).values(),
                                                        key=lambda e: str(e.get("node"))),
                 "last_reset_at": state["last_reset_at"], "last_reset_by": state["last_reset_by"],
                 "cordons": cordon_policy.normalize((stored or {}).get("cordons")),
                 # Jobs that cannot move, waiting for a held reboot (the deadline index: jobs
                 # in recovery only, never a scan).
                 "held_jobs": [{"job_id": item["job_id"], **dict(item.get("breaker_hold") or {})}
                               for item in SchedulingRepository(repo.jobs).jobs_in_recovery()
                               if item.get("job_state") == "HELD"]}
        if getattr(args, "json", False):
            print(json.dumps(shown, default=str, sort_keys=True, indent=2))
        else:
            print("\n".join(admin_views.breaker_lines(shown, now)))
        if tripped:
            print(f"breaker {answer.standing}: {answer.reason}", file=sys.stderr)
        if stored is None:
            print("the breaker has never acted (no node action recorded yet)", file=sys.stderr)
        elif shown["cluster_gpu_nodes"] is None:
            print("cluster_gpu_nodes: not counted yet; the breaker lists the cluster only when one more "
                  "node could exceed its smallest limit (limit is that minimum until then)", file=sys.stderr)
        return 0
    result = reset_breaker(repo.breaker, now=now, resume_backlog=bool(args.resume_backlog), by=_caller(),
                           max_backlog_age_seconds=args.max_backlog_age_hours * 3600)
    if not result.done:
        print("error: the breaker changed while resetting it three times in a row; try again",
              file=sys.stderr)
        return 1
    done = {"state": result.state["state"], "released": list(result.released),
            "dropped": list(result.dropped)}
    if getattr(args, "json", False):
        print(json.dumps(done, default=str, sort_keys=True, indent=2))
    else:
        print("\n".join(admin_views.reset_lines(done)))
    if result.released:
        print(f"breaker closed; {len(result.released)} held-back node action(s) released: the recovery "
              "sweep carries them out within a minute; jobs HELD on those nodes restart once they are back",
              file=sys.stderr)
    else:
        print(f"breaker closed; {len(result.dropped)} held-back node action(s) dropped; jobs HELD on those "
              "nodes fail at the next sweep (the nodes stay SUSPECT and cordoned)", file=sys.stderr)
    return 0


def _quota_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quota-table", help=f"quota table (default ${ENV_QUOTA_TABLE} or "
                                              f"{DEFAULT_QUOTA_TABLE_NAME})")
    actions = parser.add_subparsers(dest="quota_command", required=True)
    set_ = actions.add_parser("set", help="set a user's node quota at one priority level")
    set_.add_argument("--user", required=True, help="IAM ARN, or the user name gpujobs quota shows")
    set_.add_argument("--priority", required=True, help="level name (LOW ... EXTREME_HIGH) or its value")
    set_.add_argument("--nodes", required=True, type=int, help="nodes the user may hold at once (0..100000)")
    listing = actions.add_parser("list", help="every set quota and usage (or one user's, at every level)")
    listing.add_argument("--user", help="one user: every level, with the default where none is set")
    listing.add_argument("--json", action="store_true", help="print JSON")
    remove = actions.add_parser("remove", help="remove a user's quota at one level (the default applies)")
    remove.add_argument("--user", required=True, help="IAM ARN, or the user name gpujobs quota shows")
    remove.add_argument("--priority", required=True, help="level name or value")


# QuotaInputError.field -> the option the operator typed.
_QUOTA_OPTIONS = {"user": "--user", "priority": "--priority", "max_nodes": "--nodes"}


def _quota(args: argparse.Namespace, ctx: Context) -> int:
    from gpu_recovery.queue.quotas import QuotaInputError
    from gpu_recovery.settings import SettingsError

    try:
        return quota_command(args, ctx.quota_service())
    except QuotaInputError as error:
        option = _QUOTA_OPTIONS.get(error.field, f"--{error.field.replace('_', '-')}")
        message = str(error).removeprefix(f"{error.field}: ")
        print(f"error: {option}: {message}", file=sys.stderr)
        return 2
    except SettingsError as error:  # a malformed $DEFAULT_NODE_QUOTAS
        print(f"error: {error}", file=sys.stderr)
        return 2


def _limit_text(limit: Any) -> str:
    return "no limit" if limit is None else f"{limit} node(s)"


def _quota_cells(row: dict[str, Any]) -> list[str]:
    """PRIORITY, LIMIT, SOURCE, IN USE, ROOM (no limit: "unlimited")."""
    limit, room = row.get("max_nodes"), row.get("room")
    return [str(row.get("priority_name")), "unlimited" if limit is None else str(limit),
            str(row.get("source")), str(row.get("used_nodes", 0)), "-" if room is None else str(room)]


_QUOTA_HEADERS = ["PRIORITY", "LIMIT", "SOURCE", "IN USE", "ROOM"]


def _print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    for row in [headers, *rows]:
        print("  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip())


def quota_command(args: argparse.Namespace, service: Any) -> int:
    """``quota set`` / ``list`` / ``remove`` over a QuotaService; input errors raise
    ``QuotaInputError`` naming the field."""
    from gpu_recovery.domain.time_sharing import priority_name
    from gpu_recovery.queue.quotas import MAX_PAGE, subject_from

    if args.quota_command == "set":
        row = service.set_limit(args.user, args.priority, args.nodes, by=_caller())
        print(json.dumps(row, default=str, sort_keys=True, indent=2))
        print(f"quota set: {row['user']} may hold {row['max_nodes']} node(s) at once at "
              f"{row['priority_name']}; the scheduler applies it from its next tick", file=sys.stderr)
        if row["used_nodes"] > row["max_nodes"]:
            print(f"note: {row['user']} holds {row['used_nodes']} node(s) at that level now: no new job of "
                  "theirs starts there until the usage is below the quota", file=sys.stderr)
        return 0
    if args.quota_command == "remove":
        result = service.remove_limit(args.user, args.priority, by=_caller())
        print(json.dumps(result, default=str, sort_keys=True, indent=2))
        if not result["removed"]:
            print(f"{result['user']} has no quota set at {result['priority_name']}: nothing removed",
                  file=sys.stderr)
            return 1
        print(f"quota removed: {result['user']} at {result['priority_name']} now has "
              f"{_limit_text(result['max_nodes'])} ({result['source']})", file=sys.stderr)
        return 0
    if args.user:
        view = service.view(subject_from(args.user))
        if args.json:
            print(json.dumps(view, default=str, sort_keys=True, indent=2))
            return 0
        print(f"User: {view['user']}")
        _print_table(_QUOTA_HEADERS, [_quota_cells(r) for r in view["quotas"]])
        return 0
    rows: list[dict[str, Any]] = []
    token: str | None = None
    while True:  # every page: the quota partition holds one item per user and level in use
        page = service.list_all(limit=MAX_PAGE, next_token=token)
        rows += page["quotas"]
        token = page["next_token"]
        if not token:
            break
    defaults = {priority_name(level): nodes
                for level, nodes in sorted(service.defaults.items(), reverse=True)}
    if args.json:
        print(json.dumps({"quotas": rows, "defaults": defaults}, default=str, sort_keys=True, indent=2))
        return 0
    if rows:
        _print_table(["USER", *_QUOTA_HEADERS],
                     [[str(r["user"]), *_quota_cells(r)] for r in rows])
    else:
        print("no quota set and no node in use at any level", file=sys.stderr)
    shown = ", ".join(f"{name} {nodes}" for name, nodes in defaults.items())
    print(f"defaults (${ENV_DEFAULT_NODE_QUOTAS}): " + (
        f"{shown}; other levels: no limit" if shown else "none: a level without a set quota has no limit"),
        file=sys.stderr)
    return 0


def _fault_analysis_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-table",
                        help=f"job table (default ${ENV_JOB_TABLE} or {DEFAULT_JOB_TABLE_NAME})")
    parser.add_argument("--job-id", required=True, help="the job")
    parser.add_argument("--attempt", type=int, help="the attempt whose fault (default: the job's last fault)")
    parser.add_argument("--json", action="store_true", help="one JSON document")


def _fault_analysis(args: argparse.Namespace, ctx: Context) -> int:
    return fault_analysis_command(args, ctx.repository())


def fault_analysis_command(args: argparse.Namespace, repo: Any) -> int:
    """``faults``: the tally and every suspect node of one fault of a job."""
    job = repo.jobs.get_job(args.job_id)
    if job is None:
        print(f"error: no job {args.job_id!r} in the job table", file=sys.stderr)
        return 1
    attempt = args.attempt or job.tally.attempt or job.attempt
    records = repo.faults.records(job, attempt)
    rows = []
    for node, record in sorted(records.items()):
        plan = record.get("plan") or {}
        decision = plan.get("decision") or {}
        evidence = record.get("evidence") or {}
        rows.append({"node": node, "verdict": record.get("label", ""), "action": plan.get("action", ""),
                     "rule": decision.get("rule_id", ""), "reason": decision.get("reason", ""),
                     "xids": sorted({int(x["xid"]) for x in evidence.get("xids") or []}),
                     "rank": evidence.get("rank")})
    tally = job.tally.to_item() if job.tally.attempt == attempt else {}
    if args.json:
        print(json.dumps({"job_id": job.job_id, "attempt": attempt, "state": job.state.value,
                          "tally": tally, "nodes": rows}, default=str, sort_keys=True, indent=2))
        return 0
    print(f"job {job.job_id}, fault of attempt {attempt} ({job.state.value}): "
          + (", ".join(f"{k} {v}" for k, v in tally.items() if k != "attempt") or "no tally"))
    if not rows:
        print("no suspect node recorded for that attempt", file=sys.stderr)
        return 0
    _print_table(["NODE", "VERDICT", "ACTION", "RULE", "XIDS"],
                 [[r["node"], str(r["verdict"]), str(r["action"]), str(r["rule"]),
                   ",".join(str(x) for x in r["xids"]) or "-"] for r in rows])
    return 0


def _uncordon_arguments(parser: argparse.ArgumentParser) -> None:
    _node_id_argument(parser)
    parser.add_argument("--instance-table", help=f"container-instance table (default ${ENV_INSTANCE_TABLE} "
                                                 f"or {DEFAULT_INSTANCE_TABLE_NAME})")


def _uncordon(args: argparse.Namespace, ctx: Context) -> int:
    import time

    return uncordon_command(args, ctx.repository(), time.time())


def uncordon_command(args: argparse.Namespace, repo: Any, now: float) -> int:
    """``uncordon --node-id``: the node is healthy (repaired by hand): it takes new work
    again; the recovery sweep removes its ECS attribute within a minute."""
    if not repo.cordons.uncordon(args.node_id, now):
        print(f"node {args.node_id} is not cordoned", file=sys.stderr)
        return 1
    print(f"node {args.node_id} uncordoned: the recovery sweep removes its ECS attribute "
          "(gpu-recovery.cordoned) within a minute", file=sys.stderr)
    return 0


COMMANDS: list[Command] = [
    Command("doctor", "check, read-only, that the deployed stack's account is ready for a GPU fault",
            doctor.add_arguments, _doctor),
    Command("issue-token", "create or rotate a node's report token; prints it once",
            _node_id_argument, _issue_token),
    Command("revoke-token", "revoke a node's report token", _node_id_argument, _revoke_token),
    Command("list-tokens", "list nodes and token status (never the tokens)", _json_argument, _list_tokens),
    Command("breaker", "show or reset the blast-radius breaker", _breaker_arguments, _breaker),
    Command("quota", "set, list or remove users' node quotas per priority level", _quota_arguments, _quota),
    Command("uncordon", "a known-bad node repaired by hand takes new work again", _uncordon_arguments,
            _uncordon),
    Command("return-node", "a repaired QUARANTINED or SUSPECT node back to service, through the stack's own "
            "check (or --without-check)", admin_return.add_arguments, admin_return.run),
    Command("goodput", "the cluster's ETTR, GPU-hours lost per cause per day, the nodes that cost the most",
            admin_goodput.add_arguments, admin_goodput.run),
    Command("faults", "read a job's fault analysis: every suspect node, verdict, decision, XIDs",
            _fault_analysis_arguments, _fault_analysis),
    # Not "fault": one letter from "faults", which reads a deployed job's analysis.
    Command("inject-fault", "inject a fault into the local playground (make playground; local endpoints "
            "only; 'fault' is its deprecated old name)", inject_fault.add_arguments,
            lambda args, ctx: inject_fault.run(args), deprecated_aliases=("fault",)),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-recovery-admin", description=__doc__.split("\n")[0])
    parser.add_argument("--table", help=f"node-token table (default ${ENV_NODE_TOKEN_TABLE} or "
                                        f"{DEFAULT_NODE_TOKEN_TABLE_NAME})")
    parser.add_argument("--region", help="AWS region")
    parser.add_argument("--profile", help="AWS profile")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_arguments(sub.add_parser(command.name, help=command.help,
                                             aliases=list(command.deprecated_aliases)))
    return parser


def main(argv: Sequence[str] | None = None, store: TokenStore | None = None,
         session: Any = None, repo: Any = None, quotas: Any = None) -> int:
    args = build_parser().parse_args(argv)
    command = next(c for c in COMMANDS if args.command in (c.name, *c.deprecated_aliases))
    if args.command != command.name:
        print(f"warning: `gpu-recovery-admin {args.command}` is deprecated; use `gpu-recovery-admin "
              f"{command.name}`", file=sys.stderr)
    try:
        return command.run(args, Context(args, store=store, session=session, repo=repo, quotas=quotas))
    except TokenError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # boto errors: say what failed, no traceback
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
