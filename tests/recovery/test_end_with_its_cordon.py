"""A driver warning's or an AWS notice's end takes the node's cordon with it only if the
cordon is that warning's or notice's (``CordonRepository.end_with_its_cordon``): a cordon put
for another reason stays, and nothing of the end is written."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.repository.base import to_ddb
from tests.recovery.fakes import World, world

NODE = "node-a"


def put(**fields: Any) -> None:
    item = {C.INSTANCE_PK: NODE, "instance_state": InstanceState.AVAILABLE.value, **fields}
    boto3.resource("dynamodb", region_name="us-east-1").Table("instances").put_item(Item=to_ddb(item))


def item() -> dict[str, Any]:
    found = boto3.resource("dynamodb", region_name="us-east-1").Table("instances").get_item(
        Key={C.INSTANCE_PK: NODE}).get("Item")
    assert found is not None
    return found


def end_warning(w: World) -> bool:
    return bool(w.repo.warnings.clear_warning(NODE, "xid-63-rate", w.now[0], uncordon=True))


def end_notice(w: World) -> bool:
    return bool(w.repo.aws_notices.end_notice(NODE, "event-1", w.now[0], uncordon=True))


@pytest.mark.parametrize(("record", "its_cordon", "end"), [
    pytest.param({"warning": {"rule": "xid-63-rate"}}, {"cause": "xid-63-rate"}, end_warning, id="warning"),
    pytest.param({"notice": {"key": "event-1"}}, {"notice": True, "cause": "aws-notice"}, end_notice,
                 id="notice"),
])
def test_the_end_takes_its_own_cordon_and_leaves_another(record: dict[str, Any], its_cordon: dict[str, Any],
                                                         end: Any) -> None:
    with world() as w:
        put(**record, cordon=its_cordon)
        assert end(w)
        after = item()
        assert "cordon" not in after and not set(record) & set(after)

        put(**record, cordon={"cause": "operator"})
        assert not end(w)  # the cordon is not its own: nothing written
        after = item()
        assert after["cordon"] == {"cause": "operator"} and set(record) <= set(after)
