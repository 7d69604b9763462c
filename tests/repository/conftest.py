"""The repository layer's own tests keep moto's DynamoDB under their stage worlds
(tests/recovery/fakes.py serves the others from the in-memory store): its conditional writes
and transactions are held here to an emulator the project did not write (~14 s of the quick
tier's test time)."""

from __future__ import annotations

import pytest

from tests.recovery import fakes


@pytest.fixture(autouse=True)
def _moto_dynamodb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fakes, "DYNAMODB", "moto")
