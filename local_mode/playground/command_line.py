"""``python -m local_mode.playground``: the options, then the playground until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from local_mode.playground.config import MIN_REBOOT_SECONDS, PlaygroundConfig, PlaygroundError
from local_mode.playground.driver import Playground


def _stop_on_signals() -> None:
    """Ctrl-C (SIGINT) and SIGTERM stop the playground cleanly, even when it was started in
    the background by a shell that ignores SIGINT for background jobs (``make playground &``)."""
    import signal

    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m local_mode.playground",
        description="A local GPU cluster behind the local REST API: submit, watch, fault and recover jobs "
                    "with gpujobs and gpu-recovery-admin.")
    defaults = PlaygroundConfig()
    parser.add_argument("--nodes", type=int, default=defaults.nodes, help="GPU nodes (default %(default)s)")
    parser.add_argument("--gpus", type=int, default=defaults.gpus_per_node, dest="gpus_per_node",
                        help="GPUs per node (default %(default)s)")
    parser.add_argument("--speed", type=float, default=defaults.speed,
                        help="simulated seconds per wall second (default %(default)s: real time)")
    parser.add_argument("--port", type=int, default=defaults.port,
                        help="local API port (default %(default)s; 0: any free port)")
    parser.add_argument("--aws-port", type=int, default=defaults.aws_port,
                        help="emulated AWS endpoint port (default %(default)s; 0: any free port)")
    parser.add_argument("--run-minutes", type=float, default=defaults.run_minutes,
                        help="simulated minutes every training job runs (default %(default)s; a job's "
                             "PLAYGROUND_RUN_MINUTES environment variable sets its own)")
    parser.add_argument("--reboot-seconds", type=float, default=defaults.reboot_seconds,
                        help=f"how long a node takes to reboot (default %(default)s, at least "
                             f"{MIN_REBOOT_SECONDS})")
    parser.add_argument("--dcgm-seconds", type=float, default=defaults.dcgm_seconds,
                        help="how long a DCGM health check takes (default %(default)s)")
    parser.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a remediation or validation setting of the deployment "
                             "(docs/configuration.md), e.g. breaker_window_minutes=2, "
                             "validate_after_repair=false; repeatable")
    parser.add_argument("--once", action="store_true", help="deliver every event once (default: twice)")
    parser.add_argument("--verbose", action="store_true", help="also print the handlers' warnings")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = dict(pair.partition("=")[::2] for pair in args.setting)
    if any("=" not in pair for pair in args.setting):
        parser.error("--setting: expected KEY=VALUE, e.g. breaker_window_minutes=2")
    try:
        config = PlaygroundConfig(
            nodes=args.nodes, gpus_per_node=args.gpus_per_node, speed=args.speed, port=args.port,
            aws_port=args.aws_port, run_minutes=args.run_minutes, reboot_seconds=args.reboot_seconds,
            dcgm_seconds=args.dcgm_seconds, duplicate_delivery=not args.once, verbose=args.verbose,
            settings=settings).validate()
    except ValueError as error:
        parser.error(str(error))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    _stop_on_signals()
    try:
        with Playground(config) as playground:
            playground.serve_forever()
    except PlaygroundError as error:
        print(f"playground: error: {error}", file=sys.stderr)
        return 2
    return 0
