"""``gpujobs``'s command line: the argument parser and ``main`` (the console script)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from cli.gpujobs.client import DEFAULT_TIMEOUT_SECONDS, ApiClient
from cli.gpujobs.commands import (
    LOGS_POLL_SECONDS,
    cmd_cancel,
    cmd_events,
    cmd_list,
    cmd_logs,
    cmd_quota,
    cmd_resume,
    cmd_show,
    cmd_submit,
    cmd_suspend,
)
from cli.gpujobs.constants import (
    AUTO_PRIORITY,
    ENDPOINT_ENV,
    EXIT_CLIENT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_WATCH_TIMEOUT,
    NON_TERMINAL_STATES,
    POLL_ENV,
    PRIORITIES,
    PROG,
    TERMINAL_STATES,
)
from cli.gpujobs.errors import CliError
from cli.gpujobs.goodput import cmd_goodput, period_seconds
from cli.gpujobs.watch import WATCH_POLL_SECONDS, cmd_watch


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _poll_default(seconds: float) -> float:
    """``$GPUJOBS_POLL_SECONDS`` (the default interval of watch and logs --follow), else ``seconds``."""
    raw = os.environ.get(POLL_ENV, "").strip()
    try:
        return _positive_float(raw) if raw else seconds
    except argparse.ArgumentTypeError:
        return seconds


def _job_state(text: str) -> str:
    state = text.strip().upper()
    if state not in (*NON_TERMINAL_STATES, *TERMINAL_STATES):
        raise argparse.ArgumentTypeError(f"not a job state: {text!r} (e.g. RUNNING)")
    return state


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Submit and follow multi-node GPU training jobs on Amazon ECS.",
        epilog=f"Endpoint: --endpoint or ${ENDPOINT_ENV}. Exit codes: 0 ok, 1 watched job failed, "
               "2 usage/4xx, 3 5xx/network.",
    )
    parser.add_argument("--endpoint", default=None,
                        help=f"API base URL (default: ${ENDPOINT_ENV}), e.g. "
                             "https://abc.execute-api.us-east-1.amazonaws.com/v1 or http://127.0.0.1:8080")
    parser.add_argument("--region", default=None,
                        help="SigV4 signing region (default: from the endpoint host, else $AWS_REGION)")
    parser.add_argument("--profile", default=None, help="AWS profile for credentials (default: $AWS_PROFILE)")
    parser.add_argument("--timeout", type=_positive_float, default=DEFAULT_TIMEOUT_SECONDS,
                        help="HTTP timeout per try, seconds (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print raw JSON")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND")
    sub.required = True

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", dest="sub_json", action="store_true", help="print raw JSON")
        return p

    p = add("submit", "submit a job from a spec file and/or flags; prints the job id")
    p.add_argument("-f", "--file", help="JobSpec file, YAML or JSON ('-' = stdin); flags override it")
    p.add_argument("--name")
    p.add_argument("--task-definition", help="family:revision or ARN")
    p.add_argument("--container-name", help="container to override (default: the server's choice)")
    p.add_argument("--nnodes", type=_positive_int)
    p.add_argument("--gpus-per-node", type=_positive_int)
    p.add_argument("--priority", help=f"an integer, one of {', '.join(PRIORITIES)}, or {AUTO_PRIORITY} "
                                      "(the highest level where your node quota has room)")
    p.add_argument("--command", action="append", metavar="ARG",
                   help="command override: repeat once per argument, or one shell-quoted string")
    p.add_argument("--env", action="append", metavar="K=V", help="environment variable (repeatable)")
    p.add_argument("--max-recovery-attempts", type=int, help="older name of --max-infra-recoveries")
    p.add_argument("--max-infra-recoveries", type=int,
                   help="node faults fixed by a reboot or a move to healthy nodes (default 3)")
    p.add_argument("--max-app-restarts", type=int,
                   help="restarts after an application error (default 0: the job fails)")
    p.add_argument("--suspend-grace", type=_positive_int, metavar="SECONDS",
                   help="seconds rank 0 has to checkpoint and call go_suspend() once told to suspend "
                        "(default: the deployment's, 60)")
    p.add_argument("--preflight", choices=("auto", "restarts", "always", "off"),
                   help="gang preflight before the command (which must start with the training client's "
                        "wrapper): after recovery restarts, always (the first start too), off, or auto "
                        "(the deployment's default by job size)")
    p.add_argument("--label", action="append", metavar="K=V", help="label (repeatable)")
    p.add_argument("--idempotency-key", help="Idempotency-Key header (default: a fresh UUID4)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the JobSpec that would be sent; send nothing")
    p.set_defaults(func=cmd_submit)

    p = add("list", "list jobs, newest first")
    p.add_argument("--state", help="only jobs in this state")
    p.add_argument("--user", help="only jobs of this user")
    p.add_argument("--limit", type=_positive_int, help="page size")
    p.add_argument("--all", action="store_true", help="follow next_token through every page")
    p.add_argument("--next-token", help="start from this page token")
    p.set_defaults(func=cmd_list)

    p = add("show", "show one job: state, ranks, attempts, its goodput ledger")
    p.add_argument("job_id", metavar="ID")
    p.add_argument("--ranks-from", type=int, default=None, metavar="N",
                   help="the first rank shown (a large job's ranks come 100 at a time)")
    p.add_argument("--ranks-limit", type=int, default=None, metavar="N", help="ranks shown (1-1000)")
    p.set_defaults(func=cmd_show)

    p = add("goodput", "your jobs' goodput over a period: GPU-hours per cause, ETTR (docs/goodput.md)")
    p.add_argument("--since", type=period_seconds, default=7 * 86400, metavar="PERIOD",
                   help="jobs submitted within this period: 7d (default), 36h")
    p.add_argument("--user", help="another user's jobs (admins): an IAM ARN or user name")
    p.set_defaults(func=cmd_goodput)

    p = add("cancel", "cancel a job")
    p.add_argument("job_id", metavar="ID")
    p.set_defaults(func=cmd_cancel)

    p = add("suspend", "suspend a job gracefully (rank 0 checkpoints first); held until resumed")
    p.add_argument("job_id", metavar="ID")
    p.set_defaults(func=cmd_suspend)

    p = add("resume", "put a suspended job back in the queue at its original position")
    p.add_argument("job_id", metavar="ID")
    p.set_defaults(func=cmd_resume)

    p = add("quota", "your node quota at every priority level: limit, nodes in use, room")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--user", help="another user's quota (admins): an IAM ARN or the user name shown here")
    who.add_argument("--all", action="store_true", help="every quota set, and every usage (admins)")
    p.set_defaults(func=cmd_quota)

    p = add("events", "a job's state transitions")
    p.add_argument("job_id", metavar="ID")
    p.set_defaults(func=cmd_events)

    p = add("logs", "a job's training logs")
    p.add_argument("job_id", metavar="ID")
    p.add_argument("--rank", type=int, help="only this rank (default: the server's choice)")
    p.add_argument("--attempt", type=int, help="only this attempt (default: the current one)")
    p.add_argument("-F", "--follow", action="store_true", help="keep polling until the job is terminal")
    p.add_argument("--next-token", help="start from this token")
    p.add_argument("--interval", type=_positive_float, default=_poll_default(LOGS_POLL_SECONDS),
                   help=f"poll interval with --follow, seconds (default: %(default)s; ${POLL_ENV} sets it)")
    p.set_defaults(func=cmd_logs)

    p = add("watch", "follow a job's state until it ends (exit 0 COMPLETE, 1 FAILED/USER_STOPPED/CANCELED)")
    p.add_argument("job_id", metavar="ID")
    p.add_argument("--interval", type=_positive_float, default=_poll_default(WATCH_POLL_SECONDS),
                   help=f"poll interval, seconds (default: %(default)s; ${POLL_ENV} sets it)")
    # Its own dest: the global --timeout is the HTTP timeout per try.
    p.add_argument("--timeout", dest="watch_timeout", type=_positive_float, metavar="SECONDS",
                   help=f"give up after this many seconds if the job has not ended "
                        f"(exit {EXIT_WATCH_TIMEOUT}; default: wait until it ends)")
    p.add_argument("--until", type=_job_state, metavar="STATE",
                   help="stop watching once the job is in STATE (exit 0), e.g. RUNNING; a job that ends "
                        "first exits as usual")
    p.set_defaults(func=cmd_watch)
    return parser


def _report(exc: CliError) -> None:
    message = exc.message + (f" (field: {exc.field})" if exc.field else "")
    print(f"{PROG}: error: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_CLIENT
    try:
        client: ApiClient | None = None
        if not (args.command_name == "submit" and args.dry_run):
            endpoint = args.endpoint or os.environ.get(ENDPOINT_ENV)
            if not endpoint:
                raise CliError(f"no endpoint: pass --endpoint or set {ENDPOINT_ENV}")
            client = ApiClient(endpoint, region=args.region, timeout=args.timeout,
                               profile=args.profile or os.environ.get("AWS_PROFILE") or None)
        return int(args.func(client, args))
    except CliError as exc:
        _report(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `gpujobs logs ID | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (silence the flush at exit)
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
