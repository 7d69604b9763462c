"""The deployment's fault-catalog override, shipped to every function in a small layer.

``cdk synth -c fault_catalog_file=my-catalog.yaml``: ``infra.config`` has already merged
the file onto the shipped catalog and validated it (a bad file fails synthesis with the
validator's messages). Here the override is written as JSON into a layer asset
(``/opt/fault-catalog/override.json`` in the Lambda runtime, whose path the functions get in
``FAULT_CATALOG_OVERRIDE``): the functions load exactly what was validated, and the
shipped catalog stays in the code asset unchanged.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from gpu_recovery.constants import FAULT_CATALOG_LAYER_DIR, FAULT_CATALOG_OVERRIDE_FILE
from infra.config import RecoveryConfig

RUNTIME_PATH = f"/opt/{FAULT_CATALOG_LAYER_DIR}/{FAULT_CATALOG_OVERRIDE_FILE}"


def override_layer(scope: Construct, config: RecoveryConfig) -> lambda_.LayerVersion | None:
    """The layer holding the validated override, or None when the deployment has none."""
    if config.fault_catalog_override is None:
        return None
    staging = Path(tempfile.mkdtemp(prefix="gpu-recovery-catalog-"))
    target = staging / FAULT_CATALOG_LAYER_DIR / FAULT_CATALOG_OVERRIDE_FILE
    target.parent.mkdir(parents=True)
    target.write_text(config.fault_catalog_override + "\n", encoding="utf-8")
    return lambda_.LayerVersion(
        scope, "FaultCatalogOverride",
        code=lambda_.Code.from_asset(str(staging)),
        description=f"GPU recovery: fault-catalog override ({config.fault_catalog_file})"[:256],
    )
