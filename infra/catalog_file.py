"""The deployment's fault-catalog override file (``-c fault_catalog_file=...``), read at
synthesis: JSON, or YAML (PyYAML is a synth-time dependency, not in the Lambda runtime;
the functions get the validated override as JSON, ``infra/fault_catalog.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_recovery.domain.fault_catalog import CatalogError, checked_document, read_catalog_file


def read_catalog_document(path: str | Path) -> dict[str, Any]:
    """The catalog or override document in ``path`` (YAML when it ends in .yaml or .yml)."""
    path = Path(path)
    if path.suffix.lower() not in (".yaml", ".yml"):
        return read_catalog_file(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise CatalogError([f"cannot read {path}: {error.strerror or error}"], str(path)) from error
    try:
        import yaml
    except ImportError as error:
        raise CatalogError([f"{path} is YAML but PyYAML is not installed; use JSON"], str(path)) from error
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise CatalogError([f"{path} is not valid YAML: {error}"], str(path)) from error
    return checked_document(document, path)
