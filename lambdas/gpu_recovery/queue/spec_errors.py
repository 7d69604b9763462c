"""A refused request's one line, from pydantic's errors: ``<field>: <what to fix>``.

The jobs API answers a bad request with it (400, ``field`` named), and ``gpujobs submit
--dry-run`` validates a spec with :func:`validate_spec`, so it refuses what the API would,
with the same words, before sending anything.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from gpu_recovery.queue.models import JobSpec

_MESSAGES = {
    "missing": "is required",
    "extra_forbidden": "is not a known field",
    "string_pattern_mismatch": "has an invalid format",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "json_invalid": "is not valid JSON",
}
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
# Request parts Powertools puts first in an error's location.
_REQUEST_PARTS = ("body", "query", "path", "header")


class SpecError(ValueError):
    """A JobSpec the API would refuse: ``field`` and the one-line ``message`` it would give."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _path(error: Mapping[str, Any]) -> list[str]:
    loc = [str(p) for p in error.get("loc", ())]
    if loc and loc[0] in _REQUEST_PARTS:
        loc = loc[1:]
    # Union members (int | Literal) add their own loc parts; keep the field path only.
    return [p for p in loc if not p.startswith(("int", "literal[", "function-")) and p != "str"]


def _fields_at(model: type[BaseModel], path: Sequence[str]) -> list[str]:
    """The field names of the (nested) model at ``path`` (none when the path leaves the models)."""
    for name in path:
        field = model.model_fields.get(name)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def describe(error: Mapping[str, Any], model: type[BaseModel] | None = None) -> tuple[str, str]:
    """One pydantic error -> (field path, short message), e.g. ('nnodes', 'must be >= 1').
    An unknown key of ``model`` names the known field it is closest to."""
    path = _path(error)
    field = ".".join(path) or "body"
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    if kind in _BOUNDS:
        return field, f"must be {_BOUNDS[kind]} {next(iter(ctx.values()), '?')}"
    if kind in ("string_too_short", "too_short"):
        return field, f"must have at least {ctx.get('min_length', '?')} items/characters"
    if kind in ("string_too_long", "too_long"):
        return field, f"must have at most {ctx.get('max_length', '?')} items/characters"
    if kind == "value_error":
        return field, str(ctx.get("error") or error.get("msg", "is invalid")).removeprefix("Value error, ")
    if kind == "json_invalid":
        return "body", "is not valid JSON"
    if kind == "enum":
        return field, f"must be one of {ctx.get('expected', '')}".strip()
    if kind == "extra_forbidden" and model is not None and path:
        known = _fields_at(model, path[:-1])
        close = difflib.get_close_matches(path[-1], known, n=1, cutoff=0.6)
        return field, _MESSAGES[kind] + (f" (did you mean {close[0]}?)" if close else
                                          f" (known: {', '.join(known)})" if known else "")
    return field, _MESSAGES.get(kind, str(error.get("msg", "is invalid")).lower())


def first_problem(errors: Iterable[Mapping[str, Any]],
                  model: type[BaseModel] | None = None) -> tuple[str, str]:
    """The one problem a refusal names: an unknown key first (a misspelt key also makes its
    field look missing), then a value a validator refused (a union such as priority: int | name
    reports one error per member), then the first."""
    errors = list(errors)
    if not errors:
        return "body", "is invalid"
    for kind in ("extra_forbidden", "value_error"):
        for error in errors:
            if error.get("type") == kind:
                return describe(error, model)
    return describe(errors[0], model)


def validate_spec(doc: Any) -> JobSpec:
    """``doc`` as the jobs API validates a submitted spec; SpecError names what it would refuse."""
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as error:
        field, message = first_problem(error.errors(), JobSpec)
        raise SpecError(field, message) from None
