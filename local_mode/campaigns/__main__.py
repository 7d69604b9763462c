"""``python -m local_mode.campaigns [FLOW ...] [--every-call]``: run crash campaigns and print,
per flow, the AWS calls it makes, the runs (each call broken as a throttle and as a lost
response), how many ended right and the false repairs (healthy nodes repaired or held), as
one JSON line each (exit 1 if any run ended wrong). Without ``--every-call`` the first call
of each call site is broken. ``--calls-failing 0.01 --seed 3``: each flow run once with every
AWS call failing with that chance instead (a throttle or a lost response, seeded)."""

from __future__ import annotations

import os

# The handlers' own logs (Powertools reads the level when a handler is first imported).
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "CRITICAL")

import argparse
import contextlib
import io
import json
import sys

from .catalog import RUNS
from .runner import calls_failing, campaign


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("flows", nargs="*", metavar="FLOW",
                        help=f"default: every flow ({', '.join(sorted(RUNS))})")
    parser.add_argument("--every-call", action="store_true", help="break every call, not one per call site")
    parser.add_argument("--calls-failing", type=float, metavar="RATE",
                        help="run each flow once with every AWS call failing with this chance (0.01: 1 %%)")
    parser.add_argument("--seed", type=int, default=1, help="which calls --calls-failing breaks (default 1)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.flows) - set(RUNS))
    if unknown:
        parser.error(f"unknown flow(s) {', '.join(unknown)}: choose from {', '.join(sorted(RUNS))}")
    report = sys.stdout
    wrong = 0
    for flow in args.flows or sorted(RUNS):
        run = RUNS[flow]
        if args.calls_failing is not None:
            with contextlib.redirect_stdout(io.StringIO()), calls_failing(args.calls_failing, args.seed):
                result = run(None)
            problems = result.problems()
            print(json.dumps({"flow": flow, "calls_failing": args.calls_failing, "seed": args.seed,
                              "calls": len(result.calls), "broken": result.broken,
                              "false_repairs": result.false_repairs, "redriven": result.redriven,
                              "problems": problems}),
                  file=report, flush=True)
            wrong += bool(problems)
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            summary = campaign(flow, run, every_call=args.every_call)
        print(json.dumps(summary.as_dict()), file=report, flush=True)
        wrong += bool(summary.failures)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
