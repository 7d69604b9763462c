"""JobSpec unit rules (priority levels, environment forms) and the scheduler's overrides helper."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gpu_recovery.queue.jobs_api.reads import decode_token, encode_token
from gpu_recovery.queue.jobs_api.submit import slugify
from gpu_recovery.queue.models import PRIORITY_NAMES, JobSpec, Priority

BASE = {"name": "n", "task_definition": "fam:1", "nnodes": 1, "gpus_per_node": 1}


@given(st.integers(min_value=-1000, max_value=1000))
def test_only_the_seven_levels_are_accepted(value: int) -> None:
    """Given any integer priority
    When a spec is validated
    Then it is accepted exactly when it is one of the seven levels."""
    if value in {int(p) for p in Priority}:
        assert JobSpec.model_validate({**BASE, "priority": value}).priority == value
    else:
        with pytest.raises(ValidationError):
            JobSpec.model_validate({**BASE, "priority": value})


@given(st.floats(min_value=-1000, max_value=1000, allow_nan=False))
def test_a_float_priority_is_a_level_only_when_it_is_one(value: float) -> None:
    """Given a priority sent as a JSON number with a fraction part (10.0, -5.0, 12.5)
    When a spec is validated
    Then 10.0 is the level 10, and anything not a level is refused (-5.0 once sorted ahead of
    every level, in no quota's reach)."""
    if value in {float(p) for p in Priority}:
        assert JobSpec.model_validate({**BASE, "priority": value}).priority == int(value)
    else:
        with pytest.raises(ValidationError):
            JobSpec.model_validate({**BASE, "priority": value})


@pytest.mark.parametrize("name", list(PRIORITY_NAMES))
def test_level_names_map_to_values(name: str) -> None:
    """Given a level name in lower case
    When validated
    Then its numeric value is kept."""
    assert JobSpec.model_validate({**BASE, "priority": name.lower()}).priority == PRIORITY_NAMES[name]


def test_environment_forms_are_equivalent() -> None:
    """Given environment as a dict and as ECS name/value pairs
    When validated
    Then both become the ECS list form; duplicate names are refused."""
    a = JobSpec.model_validate({**BASE, "overrides": {"environment": {"A": "1"}}})
    b = JobSpec.model_validate({**BASE, "overrides": {"environment": [{"name": "A", "value": "1"}]}})
    assert a == b
    with pytest.raises(ValidationError):
        JobSpec.model_validate({**BASE, "overrides": {"environment": [
            {"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}})


@pytest.mark.parametrize("task_definition", [
    "fam:1", "arn:aws:ecs:us-east-1:111122223333:task-definition/fam:12",
    "arn:aws:ecs:us-east-1:111122223333:task-definition/fam",
])
def test_task_definition_forms(task_definition: str) -> None:
    """Given an ARN (with or without revision) or family:revision
    When validated
    Then it is accepted."""
    assert JobSpec.model_validate({**BASE, "task_definition": task_definition})


@given(st.text(max_size=80))
def test_slug_is_always_valid(name: str) -> None:
    """Given any name
    When slugified
    Then the slug is 1-40 characters of [a-z0-9-], not starting or ending with '-'."""
    slug = slugify(name)
    assert 1 <= len(slug) <= 40
    assert all(c in "abcdefghijklmnopqrstuvwxyz0123456789-" for c in slug)
    assert not slug.startswith("-") and not slug.endswith("-")


def test_tokens_round_trip() -> None:
    """Given a LastEvaluatedKey-like payload
    When encoded and decoded
    Then it is unchanged."""
    payload = {"q": "by-submitted|JOB|", "k": {"job_id_rank": "a#JOB", "submitted_at": 1.5}}
    assert decode_token(encode_token(payload)) == payload
