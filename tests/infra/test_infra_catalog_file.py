"""``infra.catalog_file``: the override file synthesis reads, JSON or YAML."""

from __future__ import annotations

import json

import pytest

from gpu_recovery.domain.fault_catalog import CatalogError, load_catalog
from gpu_recovery.domain.fault_vocabulary import Action
from infra.catalog_file import read_catalog_document


def test_yaml_override_is_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "override.yaml"
    path.write_text("schema_version: 1\nrules:\n  - id: xid-63\n    action: reboot\n")
    assert load_catalog(None, read_catalog_document(path)).rule("xid-63").action is Action.REBOOT


def test_json_override_is_read_and_a_bad_document_names_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "override.json"
    path.write_text(json.dumps({"schema_version": 1, "rules": [{"id": "xid-63", "action": "reboot"}]}))
    assert read_catalog_document(path)["rules"][0]["id"] == "xid-63"
    listed = tmp_path / "list.yml"
    listed.write_text("- id: xid-63\n")
    with pytest.raises(CatalogError, match=r"list\.yml must hold an object"):
        read_catalog_document(listed)
