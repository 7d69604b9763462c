"""The request guard (issue 40, 2a): every AWS request the stack's code makes in a local run is
held to what AWS accepts before the emulator answers it.

* **The model's constraints**: the operation's input shape in the service models botocore
  ships, recursively through structures, lists and maps: string lengths (``min``/``max``),
  blob sizes, list and map lengths, numeric ranges, enums and patterns. botocore's own
  validator checks only types, required members and minimums. A pattern is matched whole
  (AWS validates a member against its pattern as a full match) with the ``regex`` package
  (the models use ``\\p{L}``-style classes Python's ``re`` cannot compile). Each operation's
  checks are compiled once per process (closures over the shapes, patterns compiled once;
  subtrees without any constraint are not walked).
* **The prose limits** of :mod:`.prose_limits` (and :mod:`.dynamodb_limits`), each citing the
  API reference page that states it; the stateful ones read the emulated account
  (:mod:`.state`: moto's backend or the scale world's control plane).
* **DynamoDB's own refusals**: a ValidationException (or a cancelled transaction's
  ``ValidationError``) answered to the stack is a request AWS refuses too (an UpdateItem
  whose item would pass 400 KB, a key of the wrong type...): recorded as a violation.

A violation raises :class:`ContractViolation` (not a ``ClientError``: the code's ``except
ClientError`` and its retries do not take it for an AWS error) naming the operation, the
member and the value, and is recorded on the guard (``violations``) and in this process's
record (:func:`recorded`), so a run fails even when the code catches broad exceptions:
``LocalAws.__exit__`` raises for its guard's, the test suite fails a test that left one.

A limit that depends on state the stack does not own (custom attributes users put on their
container instances) is answered as AWS answers it (``AttributeLimitExceededException``), for
the code to handle.

``GPU_RECOVERY_CONTRACT_SEEN=<dir>``: each process writes the operations it saw there at exit
(``python -m local_mode.sim.contract requests --list --seen <dir>``).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from .findings import Finding, NoState, RequestState
from .prose_limits import OPERATIONS, limits_by_operation

SEEN_ENV = "GPU_RECOVERY_CONTRACT_SEEN"
_REFUSAL_KEY = "contract_refusal"
_VALUE_CHARS = 160


@dataclass(frozen=True)
class Violation:
    operation: str  # "ecs:StartTask"
    member: str  # "tags[3].value"
    value: str  # the value, shortened
    rule: str
    source: str  # "botocore model (shape TagValue)" or the API reference page

    def __str__(self) -> str:
        return f"{self.operation}: {self.member or '(request)'} = {self.value}: {self.rule} [{self.source}]"


class ContractViolation(Exception):
    """A request AWS would refuse (see the module docstring); never a ``ClientError``."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = list(violations)
        lines = "\n  ".join(str(v) for v in self.violations)
        super().__init__(f"{len(self.violations)} request(s) AWS would refuse:\n  {lines}")


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) and len(value) < _VALUE_CHARS else repr(value)
    return text if len(text) <= _VALUE_CHARS else f"{text[:_VALUE_CHARS]}... ({len(text)} characters)"


# ================================================================= the process's record
_record_lock = threading.Lock()
_recorded: list[tuple[int, Violation]] = []
_count = 0


def recorded() -> int:
    """A mark of this process's record now (for :func:`recorded_since`)."""
    with _record_lock:
        return _count


def recorded_since(mark: int) -> list[Violation]:
    """The violations recorded after ``mark`` and not taken by a test of the guard."""
    with _record_lock:
        return [v for n, v in _recorded if n >= mark]


def _record(violations: list[Violation]) -> None:
    global _count
    with _record_lock:
        for violation in violations:
            _recorded.append((_count, violation))
            _count += 1


def acknowledge(violations: list[Violation]) -> None:
    """Forget ``violations`` from the process's record (a test that expects them)."""
    gone = {id(v) for v in violations}
    with _record_lock:
        _recorded[:] = [(n, v) for n, v in _recorded if id(v) not in gone]


# ======================================================================= the model's checks
#: ``explain(value, path, findings)``: every finding under ``value``, with its member's path
Explain = Callable[[Any, str, list[Finding]], None]
#: ``fine(value)``: nothing under ``value`` breaks a constraint (no path built: the common case)
Fine = Callable[[Any], bool]
_SURROGATE_PAIR = re.compile(r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})", re.IGNORECASE)
_patterns: dict[str, Any] = {}
_UNCHECKABLE = object()
_MATCH_CACHE = 20_000  # values remembered a pattern (tag keys and values repeat call after call)
#: patterns of the models the regex package cannot compile (reported by ``--list``)
uncheckable_patterns: set[str] = set()


def _pattern(text: str) -> Callable[[str], bool] | None:
    """A model's pattern as a whole-value test, its answers cached; Java's surrogate pairs
    (``\\uD800\\uDC00``) become the code point they spell."""
    found = _patterns.get(text)
    if found is None:

        def code_point(m: re.Match[str]) -> str:
            high, low = int(m.group(1), 16), int(m.group(2), 16)
            return f"\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08x}"

        try:
            compiled = regex.compile(_SURROGATE_PAIR.sub(code_point, text))
        except regex.error:
            uncheckable_patterns.add(text)
            found = _UNCHECKABLE
        else:
            answers: dict[str, bool] = {}

            def matches(value: str) -> bool:
                answer = answers.get(value)
                if answer is None:
                    answer = compiled.fullmatch(value) is not None
                    if len(answers) < _MATCH_CACHE:
                        answers[value] = answer
                return answer

            found = matches
        _patterns[text] = found
    return None if found is _UNCHECKABLE else found  # type: ignore[return-value]


class _Compiler:
    """The checks of one service model's shapes, by shape name (recursive shapes included)."""

    def __init__(self) -> None:
        self._built: dict[str, tuple[Fine, Explain] | None] = {}

    def compile(self, shape: Any) -> tuple[Fine, Explain] | None:
        if shape.name in self._built:
            return self._built[shape.name]
        if not _constrained(shape, set()):
            self._built[shape.name] = None
            return None
        later: list[tuple[Fine, Explain]] = []  # a recursive shape refers to itself while built
        self._built[shape.name] = (lambda v: later[0][0](v), lambda v, p, out: later[0][1](v, p, out))
        checks = self._build(shape)
        later.append(checks)
        self._built[shape.name] = checks
        return checks

    def _build(self, shape: Any) -> tuple[Fine, Explain]:
        kind, md = shape.type_name, shape.metadata
        low, high = md.get("min"), md.get("max")
        where = f"botocore model, shape {shape.name}"

        def sized(size: int) -> bool:
            return (low is None or size >= low) and (high is None or size <= high)

        if kind == "structure":
            members = tuple((m, c) for m, s in shape.members.items() if (c := self.compile(s)) is not None)

            def structure_fine(value: Any) -> bool:
                if type(value) is not dict and not isinstance(value, Mapping):
                    return True
                for member, (fine, _) in members:
                    item = value.get(member)
                    if item is not None and not fine(item):
                        return False
                return True

            def structure(value: Any, path: str, out: list[Finding]) -> None:
                if isinstance(value, Mapping):
                    for member, (_, explain) in members:
                        if value.get(member) is not None:
                            explain(value[member], f"{path}.{member}" if path else member, out)

            return structure_fine, structure
        if kind == "list":
            each = self.compile(shape.member)

            def list_fine(value: Any) -> bool:
                if type(value) is not list and not isinstance(value, list | tuple):
                    return True
                if not sized(len(value)):
                    return False
                if each is not None:
                    fine = each[0]
                    for item in value:
                        if not fine(item):
                            return False
                return True

            def listing(value: Any, path: str, out: list[Finding]) -> None:
                if isinstance(value, list | tuple):
                    _length(value, len(value), low, high, "items", path, out, where)
                    if each is not None:
                        for i, item in enumerate(value):
                            each[1](item, f"{path}[{i}]", out)

            return list_fine, listing
        if kind == "map":
            keys, values = self.compile(shape.key), self.compile(shape.value)

            def map_fine(value: Any) -> bool:
                if type(value) is not dict and not isinstance(value, Mapping):
                    return True
                if not sized(len(value)):
                    return False
                key_fine = keys[0] if keys is not None else None
                value_fine = values[0] if values is not None else None
                for key, item in value.items():
                    if (key_fine is not None and not key_fine(key)) or (
                        value_fine is not None and not value_fine(item)
                    ):
                        return False
                return True

            def mapping(value: Any, path: str, out: list[Finding]) -> None:
                if isinstance(value, Mapping):
                    _length(value, len(value), low, high, "entries", path, out, where)
                    for key, item in value.items():
                        at = f"{path}[{_shown_key(key)}]"
                        if keys is not None:
                            keys[1](key, f"{at} (key)", out)
                        if values is not None:
                            values[1](item, at, out)

            return map_fine, mapping
        if kind == "string":
            enum = frozenset(shape.enum) if getattr(shape, "enum", None) else None
            pattern_text = md.get("pattern")
            matches = _pattern(pattern_text) if pattern_text else None

            def string_fine(value: Any) -> bool:
                if type(value) is not str:
                    return not isinstance(value, str) or string_fine(str(value))
                return (
                    sized(len(value))
                    and (enum is None or value in enum)
                    and (matches is None or matches(value))
                )

            def string(value: Any, path: str, out: list[Finding]) -> None:
                if isinstance(value, str):
                    _length(value, len(value), low, high, "characters", path, out, where)
                    if enum is not None and value not in enum:
                        out.append(Finding(path, value, f"one of {sorted(enum)}", source=where))
                    if matches is not None and not matches(value):
                        out.append(Finding(path, value, f"matches {pattern_text}", source=where))

            return string_fine, string
        if kind == "blob":

            def blob_size(value: Any) -> int | None:
                if isinstance(value, bytes | bytearray):
                    return len(value)
                return len(value.encode()) if isinstance(value, str) else None

            def blob_fine(value: Any) -> bool:
                size = blob_size(value)
                return size is None or sized(size)

            def blob(value: Any, path: str, out: list[Finding]) -> None:
                size = blob_size(value)
                if size is not None:
                    _length(value, size, low, high, "bytes", path, out, where)

            return blob_fine, blob

        def number_fine(value: Any) -> bool:
            if not isinstance(value, int | float) or isinstance(value, bool):
                return True
            return (low is None or value >= low) and (high is None or value <= high)

        def number(value: Any, path: str, out: list[Finding]) -> None:
            if not number_fine(value):
                out.append(Finding(path, value, f"between {low} and {high}", source=where))

        return number_fine, number


def _shown_key(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 60 else f"{text[:40]}...({len(str(key))} characters)"


def _length(
    value: Any,
    size: int,
    low: int | None,
    high: int | None,
    unit: str,
    path: str,
    out: list[Finding],
    where: str,
) -> None:
    shown = value if size < _VALUE_CHARS else f"{size} {unit}"
    if low is not None and size < low:
        out.append(Finding(path, shown, f"at least {low} {unit}", source=where))
    if high is not None and size > high:
        out.append(Finding(path, shown, f"at most {high} {unit}", source=where))


def _constrained(shape: Any, visiting: set[str]) -> bool:
    """Has the shape, or anything under it, a constraint to check?"""
    if any(k in shape.metadata for k in ("min", "max", "pattern")) or getattr(shape, "enum", None):
        return True
    if shape.name in visiting:
        return False
    visiting = visiting | {shape.name}
    if shape.type_name == "structure":
        return any(_constrained(m, visiting) for m in shape.members.values())
    if shape.type_name == "list":
        return _constrained(shape.member, visiting)
    if shape.type_name == "map":
        return _constrained(shape.key, visiting) or _constrained(shape.value, visiting)
    return False


_compile_lock = threading.Lock()
_compilers: dict[tuple[str, str], _Compiler] = {}
_operation_checks: dict[tuple[str, str, str], tuple[Fine, Explain] | None] = {}


def operation_checks(operation_model: Any) -> tuple[Fine, Explain] | None:
    """The compiled model checks of an operation's input (None: its input has no constraint)."""
    service = operation_model.service_model
    key = (service.service_name, service.api_version, operation_model.name)
    try:
        return _operation_checks[key]
    except KeyError:
        pass
    with _compile_lock:
        compiler = _compilers.setdefault(key[:2], _Compiler())
        shape = operation_model.input_shape
        checks = compiler.compile(shape) if shape is not None else None
        _operation_checks[key] = checks
        return checks


# ============================================================================== the guard
@dataclass
class RequestGuard:
    """Checks every request of a session it is installed on (module docstring)."""

    state: RequestState = field(default_factory=NoState)
    violations: list[Violation] = field(default_factory=list)
    #: operations checked ("ecs:StartTask" -> calls)
    seen: Counter[str] = field(default_factory=Counter)
    #: AWS's refusals answered for state the stack does not own ("ecs:PutAttributes" -> calls)
    refusals: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._prose = limits_by_operation()
        _track_seen(self.seen)

    # --- checking -------------------------------------------------------------------------
    def check(self, service: str, operation_model: Any, params: Mapping[str, Any]) -> tuple[str, str] | None:
        """Check one request; raises :class:`ContractViolation`, or returns the (code,
        message) AWS answers for a limit of state the stack does not own (None: fine)."""
        operation = f"{service}:{operation_model.name}"
        findings: list[Finding] = []
        checks = operation_checks(operation_model)
        if checks is not None and not checks[0](params):
            checks[1](params, "", findings)
        broken = [self._violation(operation, f, "botocore service model") for f in findings]
        answer: tuple[str, str] | None = None
        for limit in self._prose.get(operation, ()):
            for finding in limit.check(params, self.state):
                if finding.answer is not None:
                    answer = answer or finding.answer
                else:
                    broken.append(self._violation(operation, finding, limit.citation))
        with self._lock:
            self.seen[operation] += 1
            first = self.seen[operation] == 1
            if answer is not None and not broken:
                self.refusals[operation] += 1
        if first and operation not in OPERATIONS:
            self.refused_by_service(operation, "an operation nobody reviewed for the limits its API "
                                    "reference states in prose: add it, with them, to "
                                    "prose_limits.OPERATIONS",
                                    source="the request guard's list of operations")
        if broken:
            self._fail(broken)
        return answer

    @staticmethod
    def _violation(operation: str, finding: Finding, source: str) -> Violation:
        return Violation(
            operation, finding.member, _shown(finding.value), finding.rule, finding.source or source
        )

    def _fail(self, violations: list[Violation]) -> None:
        with self._lock:
            self.violations.extend(violations)
        _record(violations)
        raise ContractViolation(violations)

    def refused_by_service(self, operation: str, message: str, *,
                           source: str = "the emulated service's refusal") -> None:
        """The emulator refused a request as invalid (DynamoDB's ValidationException), or an
        operation nobody reviewed was called: recorded, not raised (the caller gets the
        service's answer, as from AWS)."""
        violation = Violation(operation, "", "(the request)", message, source)
        with self._lock:
            self.violations.append(violation)
        _record([violation])

    # --- results ----------------------------------------------------------------------------
    def take(self) -> list[Violation]:
        """The violations recorded so far, forgotten here and in the process's record (the
        tests of the guard expect them)."""
        with self._lock:
            taken, self.violations = self.violations, []
        acknowledge(taken)
        return taken

    def raise_if_violated(self) -> None:
        with self._lock:
            found = list(self.violations)
        if found:
            raise ContractViolation(found)

    # --- botocore -------------------------------------------------------------------------
    def install(self, session: Any) -> None:
        """Check every request of ``session``'s clients (those created from now on), or of
        one client (``session`` a client).

        ``before-parameter-build`` (registered on the session, it runs after boto3's
        DynamoDB mapping, which clients register under the service's name) sees the request
        as the caller built it; ``before-call`` answers a refusal; ``after-call`` records
        DynamoDB's own refusals."""
        events = session.meta.events if hasattr(session, "meta") else session.events
        events.register("before-parameter-build", self._before_parameter_build)
        events.register_first("before-call", self._before_call)
        events.register("after-call.dynamodb", self._after_dynamodb_call)

    def _before_parameter_build(self, params: Any, model: Any, context: Any = None, **_: Any) -> None:
        answer = self.check(model.service_model.service_name, model, params)
        if answer is not None and context is not None:
            context[_REFUSAL_KEY] = answer

    def _before_call(self, model: Any, context: Any = None, **_: Any) -> Any:
        answer = context.pop(_REFUSAL_KEY, None) if context is not None else None
        if answer is None:
            return None
        from ...api_hooks import hook_error

        return hook_error(model.service_model.service_id.hyphenize(), *answer)

    def _after_dynamodb_call(self, http_response: Any, parsed: Any, model: Any, **_: Any) -> None:
        parsed = parsed or {}
        error = parsed.get("Error") or {}
        operation = f"dynamodb:{model.name}"
        if error.get("Code") == "ValidationException":
            self.refused_by_service(operation, f"ValidationException: {error.get('Message', '')}")
        for i, reason in enumerate(parsed.get("CancellationReasons") or []):
            if (reason or {}).get("Code") == "ValidationError":
                self.refused_by_service(
                    operation, f"TransactItems[{i}]: ValidationError: {reason.get('Message')}"
                )


# ============================================================= operations seen, for the docs
_seen_lock = threading.Lock()
_seen_counters: list[Counter[str]] = []


def _track_seen(counter: Counter[str]) -> None:
    if not os.environ.get(SEEN_ENV):
        return
    with _seen_lock:
        if not _seen_counters:
            atexit.register(_write_seen)
        _seen_counters.append(counter)


def _write_seen() -> None:
    directory = Path(os.environ.get(SEEN_ENV, ""))
    total: Counter[str] = Counter()
    with _seen_lock:
        for counter in _seen_counters:
            total.update(counter)
    if total and directory.name:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"seen-{os.getpid()}.json").write_text(json.dumps(dict(total), sort_keys=True))


def read_seen(directory: Path) -> Counter[str]:
    total: Counter[str] = Counter()
    for path in sorted(directory.glob("seen-*.json")):
        total.update(json.loads(path.read_text()))
    return total
