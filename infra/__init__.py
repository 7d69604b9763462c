"""AWS CDK infrastructure for GPU training recovery on Amazon ECS.

``lambdas/`` holds the single source of truth (``gpu_recovery.constants``); put it on
``sys.path`` so ``infra`` can import it however it is started (app.py, pytest, cdk CLI).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LAMBDAS_DIR = REPO_ROOT / "lambdas"

if str(LAMBDAS_DIR) not in sys.path:
    sys.path.insert(0, str(LAMBDAS_DIR))
