"""``gpu-recovery-admin goodput``: the cluster's goodput over a period, from its jobs' ledgers
(docs/goodput.md): ETTR, GPU-hours lost per cause per day, and the nodes that cost the most
(the lemon list) with the faults their own history records. Reads the job-list index for the
period (a Query, never a Scan) and one instance item per lemon."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from gpu_recovery.domain.goodput_report import report
from gpu_recovery.repository.goodput import jobs_submitted_since

DEFAULT_DAYS = 7
FAULTS_SHOWN = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS, choices=range(1, 91), metavar="N",
                        help=f"jobs submitted in the last N days (1..90, default {DEFAULT_DAYS})")
    parser.add_argument("--job-table", help="the job table (default $JOB_TABLE)")
    parser.add_argument("--instance-table", help="the instance table (default $INSTANCE_TABLE)")
    parser.add_argument("--json", action="store_true", help="print JSON (for scripts)")


def goodput_command(args: argparse.Namespace, repo: Any, now: float) -> int:
    since = now - args.days * 86400
    figures = report(jobs_submitted_since(repo.tables.db, repo.tables.job_table_name, since), now)
    for lemon in figures["lemons"]:
        history = (repo.instances.get_instance_item(lemon["node"]) or {}).get("fault_history") or []
        recent = [h for h in history if float(h.get("at") or 0) >= since]
        lemon["faults"] = [str(h.get("cause") or h.get("action") or "?") for h in recent][-FAULTS_SHOWN:]
    if args.json:
        print(json.dumps({**figures, "since": since, "days": args.days}, default=str, sort_keys=True))
        return 0
    if not figures["jobs"]:
        print(f"no job ran in the last {args.days} day(s)")
        return 0
    ettr = "-" if figures["ettr"] is None else f"{figures['ettr'] * 100:.1f} %"
    print(f"{figures['jobs']} job(s) in the last {args.days} day(s): {figures['wall_gpu_hours']:.1f} "
          f"GPU-hours, ETTR {ettr}, the stack's own share {figures['stack_share_gpu_hours']:.2f} GPU-hours")
    print("\nGPU-hours lost per cause per day (the day each job was submitted):")
    for day, causes in figures["lost_per_day"].items():
        text = ", ".join(f"{cause} {hours:.2f}" for cause, hours in causes.items()) or "none"
        print(f"  {day}  {text}")
    if figures["lemons"]:
        print("\nNodes that cost the most (GPU-hours of badput charged to them; their recent faults):")
        for lemon in figures["lemons"]:
            print(f"  {lemon['node']}  {lemon['gpu_hours']:.2f}  {', '.join(lemon['faults']) or '-'}")
    if figures["lost_work_unknown_faults"]:
        print(f"\nlost work unknown for {figures['lost_work_unknown_faults']} fault(s): their jobs "
              "reported no checkpoint (gpu_recovery_client.checkpoint_saved)")
    return 0


def run(args: argparse.Namespace, ctx: Any) -> int:
    return goodput_command(args, ctx.repository(), time.time())
