"""Architecture rules, checked statically (AST) so a violation fails ``make test``:

* **Adapters are the only boto3 users.** No module of ``lambdas/`` outside
  ``gpu_recovery/adapters/`` calls an AWS API: services receive adapter objects that
  ``gpu_recovery/runtime.py`` builds (runtime builds clients but calls no operation).
* **The repository is the only DynamoDB user.** Nothing outside ``gpu_recovery/repository/``
  calls a DynamoDB operation or builds a ``Table``, with two documented exceptions:
  ``runtime.py`` builds the DynamoDB resource (and the node-token ``Table``) it hands to
  the repositories, and ``handlers/jobs_api.py`` gives the DynamoDB client to the
  Powertools idempotency layer (``DynamoDBPersistenceLayer``), a library that owns its
  own table and item format: wrapping it in a repository would only re-export it.
* **No import cycles** in lambdas/, cli/, infra/, local_mode/ and bench/, imports inside
  functions and under ``TYPE_CHECKING`` included (``KNOWN_CYCLES`` names the one pair
  the simulation-layer work removes).
* **The domain imports only the domain** (and the standard library).
* **Only the repository writes condition expressions**: no module of ``lambdas/`` or
  ``cli/`` outside ``gpu_recovery/repository/`` builds an ``Update`` or a state condition,
  passes a condition or expression keyword, or holds a string that reads like a DynamoDB
  condition (``attribute_not_exists(``, ``#state = :state``...).
* **Each kind of item has one home**: the key of every singleton item and every item-key
  builder of ``constants.py`` is used by exactly one module of ``gpu_recovery/repository/``
  (``ITEM_HOMES``: the breaker's item in ``repository/breaker.py``, the outbox in
  ``repository/notices.py``...), and by nothing else in ``lambdas/`` or ``cli/``.
* **The breaker in one place**: outside ``domain/breaker/``, ``recovery/breaker/`` and
  ``repository/breaker.py`` nothing decides or writes the breaker's state
  (``record_action``, ``admit_release``, the policy's ``reset``, ``breaker.save``,
  ``breaker.update``, ``breaker.drop_released``); the admin CLI goes through
  ``recovery.breaker.operations``.
* **One world builder**: only ``local_mode/world.py`` (``build_world``) constructs the
  ``EventBus`` and the ``SimulatedEcs`` (the scale simulator's ``ScaleWorld`` its own bus,
  timed on the engine); the demo, the playground, the scenarios, the
  campaigns, the benches and the tests enter it instead of repeating the set-up.
* **One simulation layer**: outside ``local_mode/sim/`` (and ``local_mode/events.py``, the
  event shapes) no class is named like a clock, a bus, a cluster or a simulation (in
  ``local_mode/`` and ``bench/``, like an ECS model either), no AWS event is built with
  ``local_mode/events.py`` and nothing imports EventBridge's matcher (``moto.events``), but
  the policy models named in ``POLICY_MODELS`` with their reason.
* **No hook assigned after construction** in the recovery loop: no callable is assigned to
  another object's attribute; stages emit events and the composition root declares, in one
  table, who reacts (``recovery/reactions.py``).
* **No module over 600 lines** outside ``tests/``, but those in ``LONG_MODULES``, each
  named with its reason (a module that shrinks below the limit must leave the list).

How an AWS call is recognised (no false positive on the adapters' own methods, several of
which mirror the API's names, e.g. ``EcsAdapter.stop_task(task_arn, reason)``):

* a boto3 client method accepts **keyword arguments only**, named after the operation's
  input shape (``cluster=``, ``taskDefinition=``, ``InstanceIds=``). A call ``x.<op>(...)``
  where ``<op>`` is an operation of a service the project uses, with no positional
  argument and every keyword a member of that operation's input shape, is a raw API
  call. With ``**params`` or no argument at all it is one too, unless the project itself
  defines a method of that name (then it is taken for the project's method);
* ``get_paginator``, ``<client>.exceptions``, ``.meta.client``, ``boto3.client/resource``
  and ``aws.client/resource`` only make sense on (or to get) raw clients.

The operation names and input members come from botocore's bundled service models.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import botocore.session
import pytest
from botocore import xform_name

ROOT = Path(__file__).resolve().parent.parent
LAMBDAS = ROOT / "lambdas"
PACKAGE = LAMBDAS / "gpu_recovery"
ADAPTERS = PACKAGE / "adapters"
REPOSITORY = PACKAGE / "repository"
RUNTIME = PACKAGE / "runtime.py"
JOBS_API = LAMBDAS / "handlers" / "jobs_api.py"
# Every service a Lambda of this project talks to (runtime.py must name no other one:
# see test_the_checked_services_cover_every_client_runtime_builds).
SERVICES = ("autoscaling", "cloudwatch", "dynamodb", "ec2", "ecs", "lambda", "logs", "sns", "sqs", "ssm",
            "sts")
RAW_CLIENT_ATTRIBUTES = ("get_paginator", "can_paginate", "generate_presigned_url")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


@cache
def operations() -> dict[str, dict[str, list[frozenset[str]]]]:
    """service -> snake_case operation -> input members (one set per service defining it)."""
    session = botocore.session.get_session()
    found: dict[str, dict[str, list[frozenset[str]]]] = {}
    for service in SERVICES:
        model = session.get_service_model(service)
        ops: dict[str, list[frozenset[str]]] = {}
        for name in model.operation_names:
            shape = model.operation_model(name).input_shape
            ops.setdefault(xform_name(name), []).append(frozenset(shape.members) if shape else frozenset())
        found[service] = ops
    return found


def _sources(root: Path) -> Iterator[Path]:
    yield from sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


# The checkers below read the same files many times: parsing and walking them again was most
# of this module's CPU (about 35 s of 43 in the quick tier), so each text is parsed once and
# each tree walked once.
@cache
def parsed(source: str, filename: str = "<unknown>") -> ast.Module:
    return ast.parse(source, filename)


@cache
def walk(tree: ast.AST) -> tuple[ast.AST, ...]:
    """``ast.walk(tree)``, kept (AST nodes hash by identity; the cache holds the tree)."""
    return tuple(ast.walk(tree))


def walked(source: str, filename: str = "<unknown>") -> tuple[ast.AST, ...]:
    return walk(parsed(source, filename))


@cache
def project_methods() -> frozenset[str]:
    """Names of every function the project defines (a call by one of these names with no
    keyword arguments is taken for the project's own method)."""
    names: set[str] = set()
    for path in _sources(LAMBDAS):
        for node in walked(path.read_text(), str(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
    return frozenset(names)


def aws_call(call: ast.Call, services: Iterable[str]) -> str | None:
    """``service:operation`` when ``call`` looks like a boto3 client (or resource) call."""
    if not isinstance(call.func, ast.Attribute) or call.args:
        return None
    name = call.func.attr
    named = {k.arg for k in call.keywords if k.arg is not None}
    splat = any(k.arg is None for k in call.keywords)
    for service in services:
        shapes = operations()[service].get(name)
        if not shapes:
            continue
        if named and any(named <= members for members in shapes):
            return f"{service}:{name}"
        if not named and name not in project_methods():
            return f"{service}:{name}" + (" (**params)" if splat else "")
    return None


def _dotted(node: ast.AST) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _first_string(call: ast.Call) -> str:
    arg = call.args[0] if call.args else None
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else ""


def scan(source: str, path: str, *, aws_services: Iterable[str] = (), raw_clients: bool = False,
         dynamodb: bool = False, clients_allowed: bool = False,
         dynamodb_wiring_allowed: bool = False) -> list[Finding]:
    """Findings of one module.

    * ``aws_services``: calls of these services' operations;
    * ``raw_clients``: raw-client markers, ``import boto3``, clients built (unless
      ``clients_allowed``: runtime.py builds them; a DynamoDB client or resource is also
      allowed with ``dynamodb_wiring_allowed``);
    * ``dynamodb``: any use of DynamoDB: its operations, ``Table``, ``.meta.client``,
      ``boto3.dynamodb``, its client or resource built (unless ``dynamodb_wiring_allowed``).
    """
    tree = parsed(source, path)
    findings: list[Finding] = []
    services = tuple(aws_services) + (("dynamodb",) if dynamodb else ())

    def add(node: ast.AST, what: str) -> None:
        findings.append(Finding(path, getattr(node, "lineno", 0), what))

    for node in walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module.startswith("boto3.dynamodb"):
                    if dynamodb:
                        add(node, f"imports {module}")
                elif (module == "boto3" or module.startswith("boto3.")) and raw_clients:
                    add(node, f"imports {module}")
        elif isinstance(node, ast.Call):
            hit = aws_call(node, services)
            if hit:
                add(node, f"calls the AWS API {hit} on a raw client")
            dotted = _dotted(node.func)
            if dotted in ("boto3.client", "boto3.resource", "aws.client", "aws.resource",
                          "boto3.session.Session", "boto3.Session"):
                is_dynamodb = _first_string(node) == "dynamodb"
                wired = is_dynamodb and dynamodb_wiring_allowed
                if (raw_clients and not clients_allowed and not wired) or (dynamodb and is_dynamodb
                                                                            and not wired):
                    add(node, f"builds a client: {dotted}({_first_string(node)!r})")
            if dynamodb and dotted.rsplit(".", 1)[-1] == "Table" and not dynamodb_wiring_allowed:
                add(node, f"builds a DynamoDB Table: {dotted}(...)")
        elif isinstance(node, ast.Attribute):
            if raw_clients and node.attr in RAW_CLIENT_ATTRIBUTES:
                add(node, f"uses {node.attr} (raw boto3 clients only)")
            elif raw_clients and node.attr == "exceptions" and _dotted(node.value) not in ("botocore", ""):
                add(node, f"uses {_dotted(node)} (a raw client's modeled exceptions)")
            elif (dynamodb and node.attr == "client" and isinstance(node.value, ast.Attribute)
                  and node.value.attr == "meta"):
                add(node, "uses .meta.client (the raw client under a boto3 resource)")
    return findings


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _inside(path: Path, folder: Path) -> bool:
    return folder in path.parents


def _modules() -> Iterator[Path]:
    yield from _sources(PACKAGE)
    yield from _sources(LAMBDAS / "handlers")


OTHER_SERVICES = tuple(s for s in SERVICES if s != "dynamodb")


def test_only_adapters_call_aws_apis() -> None:
    """Given every module of lambdas/ outside gpu_recovery/adapters/
    When its calls are scanned
    Then none calls an AWS API other than DynamoDB (the repository's, checked below) nor
    touches a raw client; only runtime.py (and the idempotency layer's wiring) builds clients."""
    findings: list[Finding] = []
    for path in _modules():
        if _inside(path, ADAPTERS):
            continue
        findings += scan(path.read_text(), _relative(path), aws_services=OTHER_SERVICES, raw_clients=True,
                         clients_allowed=path == RUNTIME,
                         dynamodb_wiring_allowed=path in (RUNTIME, JOBS_API) or _inside(path, REPOSITORY))
    assert not findings, "AWS calls outside gpu_recovery/adapters/:\n" + "\n".join(sorted(map(str, findings)))


def test_only_the_repository_uses_dynamodb() -> None:
    """Given every module of lambdas/ outside gpu_recovery/repository/ (and the adapters,
    which use no DynamoDB either)
    When its calls are scanned
    Then none calls a DynamoDB operation, builds a Table or uses boto3.dynamodb; runtime.py
    only builds the resource the repositories receive, and handlers/jobs_api.py only hands
    the DynamoDB client to the Powertools idempotency layer (see the module docstring)."""
    findings: list[Finding] = []
    for path in _modules():
        if _inside(path, REPOSITORY):
            continue
        findings += scan(path.read_text(), _relative(path), dynamodb=True,
                         dynamodb_wiring_allowed=path in (RUNTIME, JOBS_API))
    assert not findings, ("DynamoDB used outside gpu_recovery/repository/:\n"
                          + "\n".join(sorted(map(str, findings))))


def test_the_checked_services_cover_every_client_runtime_builds() -> None:
    """Given the services runtime.py (and the adapters) build clients for
    When compared with the services whose operations are checked
    Then none is missing (a new service would otherwise escape the check)."""
    named: set[str] = set()
    for path in [RUNTIME, JOBS_API, *_sources(ADAPTERS)]:
        for node in walked(path.read_text()):
            if (isinstance(node, ast.Call) and _first_string(node)
                    and _dotted(node.func) in ("aws.client", "aws.resource", "sess.client", "sess.resource")):
                named.add(_first_string(node))
    assert named and named <= set(SERVICES), sorted(named - set(SERVICES))


# ----------------------------------------------------------------- the checker itself
# What the queue did before the adapters took these calls over (issue 7's audit): each
# must be found. And what services do with adapters (same names, positional or
# snake_case arguments): none may be.
VIOLATIONS = {
    "describe_task_definition": "self._ecs.describe_task_definition(taskDefinition=ref)['taskDefinition']",
    "stop_task": "self._ecs.stop_task(cluster=self.cluster, task=task_arn, reason=reason[:255])",
    "get_log_events": "self._logs.get_log_events(**params)",
    "get_log_events kw": "self._logs.get_log_events(logGroupName=g, logStreamName=s, startFromHead=True)",
    "paginator": "self._ecs.get_paginator('list_container_instances').paginate(cluster=self.cluster)",
    "describe_container_instances":
        "self._ecs.describe_container_instances(cluster=self.cluster, containerInstances=arns[0:100])",
    "invoke": "self._lambda.invoke(FunctionName=f, InvocationType='Event', Payload=b'{}')",
    "describe_instances": "self._ec2.describe_instances(InstanceIds=[instance_id])",
    "describe_instance_information":
        "self._ssm.describe_instance_information(Filters=[{'Key': 'InstanceIds', 'Values': [i]}])",
    "modeled exception": "try:\n    pass\nexcept self._logs.exceptions.ResourceNotFoundException:\n    pass",
    "client": "ecs = aws.client('ecs')",
}
ADAPTER_STYLE = [
    "self.ecs.stop_task(rank.task_arn, 'why')",
    "self.ecs.start_task(task_definition=td, container_instance_arn=ci, overrides=o, tags=t, started_by=sb)",
    "self.ecs.describe_task(task_arn)",
    "self.ecs.container_instances(('ACTIVE',))",
    "self.task_definitions.describe(ref)",
    "self.hosts.address(instance_id)",
    "self.logs.read_stream(group, stream, limit=10, next_token=None)",
    "self.repo.jobs.get_ranks(job)",
    "self.notifier.publish(notification)",
    "self.rebooter.reboot(instance_id, reason)",
    "items.update(other)",
    "d.get('key')",
]


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_the_checker_finds_raw_client_calls(name: str) -> None:
    """Given a snippet of the raw-client calls the queue made before the adapters existed
    When it is scanned as a service module
    Then it is reported."""
    assert scan(VIOLATIONS[name], "snippet.py", aws_services=OTHER_SERVICES, raw_clients=True), name


DYNAMODB_VIOLATIONS = [
    "table.query(IndexName=i, KeyConditionExpression=k)",
    "self._table.get_item(Key={'job_id_rank': key}, ConsistentRead=True)",
    "aws.resource('dynamodb').Table(name)",
    "self._client.transact_write_items(TransactItems=items)",
    "from boto3.dynamodb.conditions import Key",
]


@pytest.mark.parametrize("snippet", DYNAMODB_VIOLATIONS)
def test_the_checker_finds_dynamodb_use(snippet: str) -> None:
    """Given a DynamoDB call of the kind the heartbeat service and the queue once made directly
    When it is scanned as a module outside the repository
    Then it is reported."""
    assert scan(snippet, "snippet.py", dynamodb=True)


@pytest.mark.parametrize("snippet", ADAPTER_STYLE)
def test_the_checker_leaves_adapter_and_repository_calls_alone(snippet: str) -> None:
    """Given calls on adapters, ports and plain objects (some named like AWS operations)
    When scanned
    Then nothing is reported."""
    assert scan(snippet, "snippet.py", aws_services=OTHER_SERVICES, raw_clients=True, dynamodb=True) == []


# ----------------------------------------------------------------- import structure
#: where each first-party package lives (lambdas/ is the Lambda asset root)
IMPORT_ROOTS = {LAMBDAS: ("gpu_recovery", "handlers"), ROOT: ("cli", "infra", "local_mode", "bench")}
DOMAIN = PACKAGE / "domain"
#: Import cycles that exist today, each the exact set of modules in it (none: any cycle fails
#: the test).
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool  # an __init__.py: relative imports resolve from the module itself


@cache
def project_modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for base, packages in IMPORT_ROOTS.items():
        for package in packages:
            for path in _sources(base / package):
                parts = list(path.relative_to(base).with_suffix("").parts)
                is_package = parts[-1] == "__init__"
                name = ".".join(parts[:-1] if is_package else parts)
                found[name] = Module(name, path, is_package)
    return found


def imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """Every module ``tree`` imports, absolute, with its line: module level, inside
    functions and under ``if TYPE_CHECKING`` alike. ``from a import b`` yields ``a.b``: the
    module ``a.b`` if there is one, else a name in ``a`` (``_resolve`` tells)."""
    for node in walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                base = parts[: len(parts) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                yield f"{source}.{alias.name}", node.lineno


def _resolve(name: str, modules: Iterable[str]) -> str | None:
    """The project module ``name`` is (or is in), None for anything else (stdlib, libraries).
    Importing ``a.b`` runs ``a/__init__.py`` too, but that implicit edge is not counted: a
    package whose ``__init__`` re-exports its modules would otherwise be a cycle with each."""
    known = set(modules)
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    """module -> {project module it imports: first line}."""
    graph: dict[str, dict[str, int]] = {}
    for name, module in modules.items():
        edges: dict[str, int] = {}
        tree = parsed(module.path.read_text(), str(module.path))
        for imported, line in imported_names(tree, name, module.is_package):
            target = _resolve(imported, modules)
            if target is not None and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in graph:
                    continue
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def _describe(component: frozenset[str], graph: dict[str, dict[str, int]],
              modules: dict[str, Module]) -> str:
    edges = [f"  {_relative(modules[a].path)}:{graph[a][b]} imports {b}"
             for a in sorted(component) for b in sorted(graph[a]) if b in component]
    return "\n".join([f"cycle of {len(component)} modules:", *edges])


def test_no_import_cycles() -> None:
    """Given every module of lambdas/, cli/, infra/, local_mode/ and bench/
    When their imports are followed (module level, inside functions and under
    TYPE_CHECKING alike)
    Then no module imports itself back through others, but the known cycles (KNOWN_CYCLES),
    each of which still exists (a fixed one must leave the list)."""
    modules = project_modules()
    graph = import_graph(modules)
    found = cycles(graph)
    unexpected = [c for c in found if c not in KNOWN_CYCLES]
    assert not unexpected, "import cycles:\n" + "\n".join(_describe(c, graph, modules) for c in unexpected)
    fixed = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert not fixed, f"no longer cycles, remove them from KNOWN_CYCLES: {fixed}"


def test_domain_imports_only_the_domain_and_the_standard_library() -> None:
    """Given every module of gpu_recovery/domain/
    When its imports are read (inside functions too)
    Then each names the standard library or gpu_recovery.domain: the domain reads no
    settings, constants, adapters or libraries of the rest of the project."""
    modules = project_modules()
    findings: list[str] = []
    for module in modules.values():
        if not _inside(module.path, DOMAIN) and module.path.parent != DOMAIN:
            continue
        tree = parsed(module.path.read_text(), str(module.path))
        for imported, line in imported_names(tree, module.name, module.is_package):
            top = imported.split(".")[0]
            if imported.startswith("gpu_recovery.domain.") or (top in sys.stdlib_module_names
                                                               and top != "gpu_recovery"):
                continue
            findings.append(f"{_relative(module.path)}:{line}: imports {imported}")
    assert not findings, "domain/ importing outside domain/ and the standard library:\n" + "\n".join(
        sorted(set(findings)))


CYCLE_SNIPPETS = {
    # a -> b at module level, b -> a inside a function: a cycle
    "function-level": ({"pkg.a": "from pkg import b\n", "pkg.b": "def f():\n    from pkg import a\n"}, True),
    "type-checking": ({"pkg.a": "import pkg.b\n",
                       "pkg.b": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.a import X\n"}, True),
    "relative": ({"pkg.a": "from .b import y\n", "pkg.b": "from . import a\n"}, True),
    "three": ({"pkg.a": "import pkg.b\n", "pkg.b": "import pkg.c\n", "pkg.c": "from pkg.a import x\n"}, True),
    "chain": ({"pkg.a": "import pkg.b\n", "pkg.b": "import pkg.c\n", "pkg.c": "import os\n"}, False),
}


@pytest.mark.parametrize("name", sorted(CYCLE_SNIPPETS))
def test_the_cycle_check_sees_function_level_relative_and_type_checking_imports(name: str) -> None:
    """Given small module sets, some with a cycle hidden in a function, under TYPE_CHECKING or
    behind relative imports
    When their graph is built as the project's is
    Then the cycle is found exactly when there is one."""
    sources, has_cycle = CYCLE_SNIPPETS[name]
    graph = {}
    for module, source in sources.items():
        edges: dict[str, int] = {}
        for imported, line in imported_names(parsed(source), module, False):
            target = _resolve(imported, sources)
            if target is not None and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    assert bool(cycles(graph)) is has_cycle, graph


def test_nothing_runtime_builds_imports_it_back() -> None:
    """Given every module of gpu_recovery/ but runtime.py (the one place that builds
    services) When its imports are read (inside functions too) Then none imports runtime:
    a service gets what it needs passed in (handlers, local mode and tools call runtime)."""
    modules = project_modules()
    findings = [f"{_relative(m.path)}:{line}"
                for m in modules.values() if _inside(m.path, PACKAGE) and m.path != RUNTIME
                for imported, line in imported_names(parsed(m.path.read_text()), m.name, m.is_package)
                if _resolve(imported, modules) == "gpu_recovery.runtime"]
    assert not findings, "gpu_recovery modules importing runtime back: " + ", ".join(findings)



# ----------------------------------------------------------------- repository homes
CLI = ROOT / "cli"
CONSTANTS = PACKAGE / "constants.py"
#: keyword arguments that carry a DynamoDB condition or expression
CONDITION_KEYWORDS = frozenset({
    "ConditionExpression", "KeyConditionExpression", "FilterExpression", "UpdateExpression",
    "ProjectionExpression", "condition", "condition_names", "condition_values", "extra_condition",
    "extra_names", "extra_values"})
#: what only the repository builds
CONDITION_BUILDERS = frozenset({"Update", "state_condition"})
CONDITION_TEXT = re.compile(
    r"attribute_(?:not_)?exists\(|attribute_type\(|begins_with\(|\bcontains\(#|\bsize\(#"
    r"|#\w+(?:\.#\w+)*\s*(?:=|<>|<=|>=|<|>|IN)\s*[:(]")


def condition_findings(source: str, path: str) -> list[Finding]:
    """A condition expression written (or an update built) in ``source``."""
    findings: list[Finding] = []
    for node in walked(source, path):
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        if text is not None and CONDITION_TEXT.search(text):
            findings.append(Finding(path, node.lineno, f"condition text {text[:60]!r}"))
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else _dotted(node.func)
            if name in CONDITION_BUILDERS:
                findings.append(Finding(path, node.lineno, f"builds {name}(...)"))
            findings += [Finding(path, node.lineno, f"passes {k.arg}=") for k in node.keywords
                         if k.arg in CONDITION_KEYWORDS]
    return findings


def _product_modules() -> Iterator[Path]:
    """lambdas/ (the Lambdas) and cli/ (the operators' tools, which use the same repository)."""
    yield from _sources(LAMBDAS)
    yield from _sources(CLI)


def test_only_the_repository_writes_condition_expressions() -> None:
    """Given every module of lambdas/ and cli/ outside gpu_recovery/repository/
    When its calls and strings are scanned
    Then none builds an Update or a state condition, passes a condition or expression
    keyword, or spells a DynamoDB condition: services call the repository's intents."""
    findings = [f for path in _product_modules() if not _inside(path, REPOSITORY)
                for f in condition_findings(path.read_text(), _relative(path))]
    assert not findings, ("condition expressions outside gpu_recovery/repository/:\n"
                          + "\n".join(sorted(map(str, findings))))


CONDITION_SNIPPETS = [
    "repo.tables.db.apply(Update(table=t, key=k, set_fields={}))",
    "table.update_item(Key=k, ConditionExpression='attribute_exists(#k)')",
    "repo.instances.instance_update(i, extra_condition=x)",
    "WHERE = '#st = :st AND #att = :att'",
    "GONE = 'attribute_not_exists(#k)'",
    "state_condition('job_state', states, 'js')",
]


@pytest.mark.parametrize("snippet", CONDITION_SNIPPETS)
def test_the_condition_check_finds_conditions_written_outside(snippet: str) -> None:
    """Given a condition written the ways the repository writes them
    When scanned as a module outside the repository
    Then it is reported (and a plain sentence or an intent call is not)."""
    assert condition_findings(snippet, "snippet.py"), snippet
    assert condition_findings("repo.rank_events.enter_recovery(job_id, attempt, reason='fault: #3 = bad')\n"
                              "TEXT = 'the node is back (size of the set: 3)'\n", "snippet.py") == []


#: every singleton item key and item-key builder of constants.py -> the one repository
#: module that reads and writes that kind of item
ITEM_HOMES = {
    "BREAKER_ITEM_KEY": "breaker.py",
    "CORDON_SYNC_ITEM_KEY": "cordons.py",
    "ECS_RATE_ITEM_KEY": "rate_limit.py",
    "ECS_DESCRIBE_RATE_ITEM_KEY": "rate_limit.py",
    "HEALTH_CHECK_SLOTS_KEY": "health_check_slots.py",
    "health_check_slots_key": "health_check_slots.py",
    "health_check_slot_shard_key": "health_check_slots.py",
    "suspect_item_key": "faults.py",
    "suspect_key_prefix": "faults.py",
    "placement_item_key": "faults.py",
    "fault_tally_shard_key": "faults.py",
    "latch_shard_key": "latches.py",
    "latch_head_key": "latches.py",
    "refused_item_key": "registrations.py",
    "unprotected_task_key": "registrations.py",
    "launch_plan_key": "scheduling.py",
    "notice_item_key": "notices.py",
    "verdict_lease_key": "verdict_leases.py",
    "preflight_item_key": "preflight.py",
    "tenant_evidence_job_key": "tenant_evidence.py",
    "tenant_evidence_user_key": "tenant_evidence.py",
}


def _item_keys() -> set[str]:
    """The singleton item keys (``*_ITEM_KEY``, ``*_SLOTS_KEY``...) and item-key builders
    (``*_key`` functions but a job's and a rank's, which every repository of the job
    table builds on) that constants.py defines."""
    tree = parsed(CONSTANTS.read_text())
    names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name) and t.id.endswith("_KEY") and t.id.isupper()}
    names |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
              and (node.name.endswith(("_key", "_key_prefix"))) and node.name not in
              ("job_item_key", "rank_item_key")}
    return names


def _names_used(path: Path) -> set[str]:
    tree = parsed(path.read_text())
    used = {n.id for n in walk(tree) if isinstance(n, ast.Name)}
    used |= {n.attr for n in walk(tree) if isinstance(n, ast.Attribute)}
    used |= {a.asname or a.name for n in walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    return used


def test_each_kind_of_item_has_one_repository_home() -> None:
    """Given every singleton item key and item-key builder of constants.py
    When the modules of lambdas/ and cli/ that use it are listed
    Then it is exactly its home in ITEM_HOMES (one repository module per kind of item:
    the breaker's item in repository/breaker.py, the outbox in repository/notices.py...),
    and every such key has a home."""
    keys = _item_keys()
    assert keys == set(ITEM_HOMES), (
        f"item keys without a home, or homes of no key: {sorted(keys ^ set(ITEM_HOMES))}")
    users: dict[str, set[str]] = {key: set() for key in keys}
    for path in _product_modules():
        if path == CONSTANTS:
            continue
        for key in keys & _names_used(path):
            users[key].add(_relative(path))
    wrong = {key: sorted(found) for key, found in users.items()
             if found != {_relative(REPOSITORY / ITEM_HOMES[key])}}
    assert not wrong, f"items used outside their repository home: {wrong}"


# ----------------------------------------------------------------- the breaker's homes
BREAKER_HOMES = (PACKAGE / "domain" / "breaker", PACKAGE / "recovery" / "breaker")
BREAKER_REPOSITORY = REPOSITORY / "breaker.py"
BREAKER_POLICY = "gpu_recovery.domain.breaker.breaker"
#: the policy's functions that decide a new state of the breaker
BREAKER_DECISIONS = frozenset({"record_action", "admit_release", "reset"})
#: the breaker repository's writes of its item (``repo.breaker``)
BREAKER_WRITES = frozenset({"save", "update", "drop_released"})


def breaker_findings(source: str, path: str) -> list[Finding]:
    """The breaker's state decided (its policy's state changes) or written in ``source``."""
    tree = parsed(source, path)
    policy_names: set[str] = set()
    findings: list[Finding] = []
    for node in walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "gpu_recovery.domain.breaker":
            policy_names |= {a.asname or a.name for a in node.names if a.name == "breaker"}
        elif isinstance(node, ast.ImportFrom) and node.module == BREAKER_POLICY:
            findings += [Finding(path, node.lineno, f"imports {a.name} of {BREAKER_POLICY}")
                         for a in node.names if a.name in BREAKER_DECISIONS]
        elif isinstance(node, ast.Import):
            policy_names |= {a.asname for a in node.names if a.name == BREAKER_POLICY and a.asname}
    for node in walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = _dotted(node.func.value)
            if node.func.attr in BREAKER_DECISIONS and receiver in policy_names:
                findings.append(Finding(path, node.lineno, f"decides the breaker's state: {receiver}."
                                                           f"{node.func.attr}(...)"))
            elif node.func.attr in BREAKER_WRITES and receiver.rpartition(".")[2] == "breaker":
                findings.append(Finding(path, node.lineno, f"writes the breaker's item: .{node.func.attr}()"))
    return findings


def test_only_the_breakers_homes_decide_and_write_its_state() -> None:
    """Given every module of lambdas/ and cli/ outside domain/breaker/, recovery/breaker/
    and repository/breaker.py
    When its imports and calls are read
    Then none decides a new state of the breaker (record_action, admit_release, the
    policy's reset) nor writes its item: every node action asks recovery.breaker.gate, and
    the sweep and the admin CLI go through recovery.breaker.operations."""
    findings = [f for path in _product_modules()
                if path != BREAKER_REPOSITORY and not any(_inside(path, home) for home in BREAKER_HOMES)
                for f in breaker_findings(path.read_text(), _relative(path))]
    assert not findings, "the breaker decided or written outside its homes:\n" + "\n".join(
        sorted(map(str, findings)))


BREAKER_SNIPPETS = [
    "from gpu_recovery.domain.breaker import breaker\nbreaker.record_action(None, node=n, action=a, now=t,"
    " cluster_gpu_nodes=4)",
    "from gpu_recovery.domain.breaker import breaker as policy\nresult = policy.reset(stored, now=t,"
    " resume_backlog=True)",
    "from gpu_recovery.domain.breaker.breaker import admit_release",
    "import gpu_recovery.domain.breaker.breaker as b\nb.admit_release(s, node=n, action=a, now=t,"
    " cluster_gpu_nodes=4)",
    "repo.breaker.save(state, version)",
]


@pytest.mark.parametrize("snippet", BREAKER_SNIPPETS)
def test_the_breaker_check_finds_its_state_changed_elsewhere(snippet: str) -> None:
    """Given the breaker's state decided or written the ways its homes do it
    When scanned as another module
    Then it is reported (reading it, as `breaker show` and doctor do, is not)."""
    assert breaker_findings(snippet, "snippet.py"), snippet
    assert breaker_findings("from gpu_recovery.domain.breaker import breaker\n"
                            "state = breaker.normalize(repo.breaker.read())\nbreaker.status(state, now=t,"
                            " cluster_gpu_nodes=4)\n", "snippet.py") == []


# ----------------------------------------------------------------- module size
MAX_MODULE_LINES = 600
#: where the size limit applies (tests/ is not counted: a test module mirrors what it tests)
SIZED = ("lambdas", "cli", "infra", "local_mode", "bench", "agent", "health_check", "training_client")
#: modules allowed over the limit, each with its reason
LONG_MODULES = {
    "agent/gpu_node_agent.py": "the node agent is one stdlib-only file: its source is the container "
                               "command (and a systemd unit's script), copied to each node as is",
    "training_client/gpu_recovery_client.py": "the training client is one stdlib-only file users copy "
                                              "into their images: the suspend channel, the preflight "
                                              "wrapper and its all-reduce benchmark",
}


def _line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_over_600_lines_but_those_named_with_a_reason() -> None:
    """Given every Python module outside tests/
    When its lines are counted
    Then none is over MAX_MODULE_LINES but those in LONG_MODULES, each of which still is
    (one that shrank must leave the list, so the list only shrinks)."""
    sizes = {_relative(path): _line_count(path) for folder in SIZED for path in _sources(ROOT / folder)}
    sizes["app.py"] = _line_count(ROOT / "app.py")
    over = {path: lines for path, lines in sizes.items() if lines > MAX_MODULE_LINES}
    unexpected = {path: lines for path, lines in over.items() if path not in LONG_MODULES}
    assert not unexpected, (f"modules over {MAX_MODULE_LINES} lines (split them along their seams, or name "
                            f"them in LONG_MODULES with the reason): {unexpected}")
    stale = sorted(set(LONG_MODULES) - set(over))
    assert not stale, f"no longer over {MAX_MODULE_LINES} lines (or gone): remove from LONG_MODULES: {stale}"
    assert all(reason.strip() for reason in LONG_MODULES.values())


# ----------------------------------------------------------------- one world builder
WORLD_BUILDER = "local_mode/world.py"
#: what the world builder alone constructs
WORLD_PARTS = ("EventBus", "SimulatedEcs", "ScaleWorld")
#: the scale simulator's world, which builds its own EventBus (timed on the engine)
SCALE_WORLD_BUILDER = "local_mode/scale_recovery.py"


def world_parts_built(source: str, path: str) -> list[str]:
    """``path:line Name(`` for each construction of a world part in ``source``."""
    found = []
    for node in walked(source, path):
        if isinstance(node, ast.Call):
            func = node.func
            name = (func.id if isinstance(func, ast.Name)
                    else func.attr if isinstance(func, ast.Attribute) else "")
            if name in WORLD_PARTS:
                found.append(f"{path}:{node.lineno} {name}(")
    return found


def test_only_the_world_builder_builds_the_bus_and_the_simulated_ecs() -> None:
    """Given every module of the project, tests included
    When the constructions of EventBus, SimulatedEcs and ScaleWorld are listed
    Then all are in local_mode/world.py (everything else enters build_world, either backend),
    but the scale simulator's bus (ScaleWorld's, timed on the engine)."""
    found = [hit for folder in (*SIZED, "tests") for path in _sources(ROOT / folder)
             if _relative(path) != WORLD_BUILDER
             for hit in world_parts_built(path.read_text(), _relative(path))
             if not (_relative(path) == SCALE_WORLD_BUILDER and hit.endswith(" EventBus("))]
    assert not found, f"set up the world with local_mode.world.build_world, not by hand: {found}"
    assert world_parts_built((ROOT / WORLD_BUILDER).read_text(), WORLD_BUILDER)


@pytest.mark.parametrize("snippet", ["bus = EventBus(duplicate_delivery=True)",
                                     "sim = ecs.SimulatedEcs(local, bus)",
                                     "world = sr.ScaleWorld(seed=1)"])
def test_the_world_check_finds_a_part_built_by_hand(snippet: str) -> None:
    assert world_parts_built(snippet, "x.py")


def imported_test_modules(source: str, path: str) -> list[str]:
    """``path:line name`` for each test module (``tests/**/test_*.py``) ``source`` imports."""
    parts = list(Path(path).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    module = ".".join(parts[:-1] if is_package else parts)
    imported = imported_names(parsed(source, path), module, is_package)
    return [f"{path}:{line} {name}" for name, line in imported
            if name.split(".")[0] == "tests" and any(p.startswith("test_") for p in name.split(".")[1:])]


def test_no_test_module_is_imported_by_another() -> None:
    """Given every module under tests/
    When the modules each imports are listed
    Then none is a test module: what several tests share lives in tests/fixtures, or beside
    its tests in a module of helpers (a folder's steps.py, world.py, fakes.py)."""
    found = [hit for path in _sources(ROOT / "tests")
             for hit in imported_test_modules(path.read_text(), _relative(path))]
    assert not found, f"move what is shared into tests/fixtures or a helpers module: {found}"


@pytest.mark.parametrize("snippet", ["from tests.recovery.breaker.test_held_jobs import FAULTY",
                                     "from .test_held_jobs import _sent",
                                     "import tests.recovery.test_cordons"])
def test_the_test_import_check_finds_a_test_module_imported(snippet: str) -> None:
    assert imported_test_modules(snippet, "tests/recovery/breaker/test_auto_close.py")
    assert not imported_test_modules("from tests.recovery.breaker.steps import PEER",
                                     "tests/recovery/breaker/test_auto_close.py")
# ----------------------------------------------------------------- one simulation layer
SIMULATION_LAYER = "local_mode/sim/"
#: a class so named is a clock, an event bus, an ECS cluster or a discrete-event core
SIMULATOR_CLASS = re.compile(r"(Clock|Bus|Cluster|Simulation)$")
#: in local_mode/ and bench/ (which simulate AWS), a class of this name models ECS
ECS_MODEL_CLASS = re.compile(r"Ecs")
SIMULATING_FOLDERS = ("local_mode/", "bench/")
#: local_mode/events.py's builders of AWS-shaped events: the data planes and buses emit them
EVENT_BUILDERS = frozenset({"task_state_change", "container_instance_state_change", "scheduled_event"})
#: models of the stack's own policy, not of an AWS service, each with its reason
POLICY_MODELS = {
    "bench/time_sharing_day.py:DaySimulation": "a day of the queue's admission and preemption "
                                               "policy, tick by tick, on free-GPU counts: no ECS "
                                               "API, no event, no bus, gpu_recovery's clock untouched",
}


def simulator_parts_defined(source: str, path: str) -> list[str]:
    """``path:line what`` for each piece of a simulator of AWS in ``source``: a class named like
    a clock, a bus, a cluster or a simulation (or, in local_mode/ and bench/, like an ECS model),
    an AWS event built with local_mode/events.py, EventBridge's rule matcher imported."""
    found = []
    for node in walked(source, path):
        if isinstance(node, ast.ClassDef):
            if f"{path}:{node.name}" in POLICY_MODELS:
                continue
            if SIMULATOR_CLASS.search(node.name) or (
                    path.startswith(SIMULATING_FOLDERS) and ECS_MODEL_CLASS.search(node.name)):
                found.append(f"{path}:{node.lineno} class {node.name}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = (func.id if isinstance(func, ast.Name)
                    else func.attr if isinstance(func, ast.Attribute) else "")
            if name in EVENT_BUILDERS:
                found.append(f"{path}:{node.lineno} {name}( (an AWS event emitted)")
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(n == "moto.events" or n.startswith("moto.events.") for n in names):
                found.append(f"{path}:{node.lineno} imports moto.events (EventBridge rules matched)")
    return found


def test_nothing_outside_the_simulation_layer_models_a_clock_a_bus_or_ecs() -> None:
    """Given every module outside tests/ but local_mode/sim/ and local_mode/events.py (the
    event shapes)
    When the classes named like a clock, a bus, a cluster or a simulation (an ECS model, in
    local_mode/ and bench/), the AWS events built and the imports of EventBridge's matcher are
    listed
    Then there are none but the named policy models (POLICY_MODELS, each still present): one
    clock, one bus and one ECS model per world, in local_mode/sim/."""
    found, policy_models = [], set()
    for folder in SIZED:
        for path in _sources(ROOT / folder):
            relative = _relative(path)
            if relative.startswith(SIMULATION_LAYER) or relative == "local_mode/events.py":
                continue
            source = path.read_text()
            found += simulator_parts_defined(source, relative)
            policy_models |= {f"{relative}:{node.name}" for node in walked(source, relative)
                              if isinstance(node, ast.ClassDef)}
    assert not found, f"simulate AWS in local_mode/sim/ (and use it from there): {found}"
    stale = sorted(set(POLICY_MODELS) - policy_models)
    assert not stale, f"gone: remove from POLICY_MODELS: {stale}"
    assert all(reason.strip() for reason in POLICY_MODELS.values())


@pytest.mark.parametrize(("snippet", "path"), [
    ("class WallClock:\n    pass\n", "local_mode/demo.py"),
    ("class TimedBus:\n    pass\n", "bench/x.py"),
    ("class GpuCluster:\n    pass\n", "cli/x.py"),
    ("class StormSimulation:\n    pass\n", "local_mode/x.py"),
    ("class FakeEcs:\n    pass\n", "bench/x.py"),
    ("event = ev.task_state_change(task, time=0.0)\n", "local_mode/x.py"),
    ("from moto.events.models import EventPattern\n", "bench/x.py"),
    ("import moto.events\n", "local_mode/x.py"),
])
def test_the_simulation_layer_check_finds_a_simulator_outside_it(snippet: str, path: str) -> None:
    assert simulator_parts_defined(snippet, path)


@pytest.mark.parametrize(("snippet", "path"), [
    ("class EcsAdapter:\n    pass\n", "lambdas/gpu_recovery/adapters/ecs.py"),
    ("service.on_task_state_change(detail)\n", "local_mode/scale_recovery.py"),
    ("class DaySimulation:\n    pass\n", "bench/time_sharing_day.py"),
    ("from moto import mock_aws\n", "local_mode/emulator.py"),
])
def test_the_simulation_layer_check_leaves_the_rest_alone(snippet: str, path: str) -> None:
    assert simulator_parts_defined(snippet, path) == []


# ------------------------------------------------------- no hook assigned after construction
REACTING_PACKAGE = "lambdas/gpu_recovery/recovery"


def hooks_assigned(source: str, path: str) -> list[str]:
    """``path:line target`` for each callable (a lambda, a method of ``self`` or of one of its
    parts) assigned to an attribute of another object: a hook patched in after construction."""
    found = []
    for node in walked(source, path):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = node.value
        callable_value = isinstance(value, ast.Lambda) or (
            isinstance(value, ast.Attribute) and isinstance(_root(value), ast.Name)
            and _root(value).id == "self")
        for target in targets:
            if isinstance(target, ast.Attribute) and callable_value \
                    and not (isinstance(target.value, ast.Name) and target.value.id in ("self", "cls")):
                found.append(f"{path}:{node.lineno} {ast.unparse(target)}")
    return found


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def test_no_recovery_stage_has_a_hook_assigned_after_construction() -> None:
    """Given every module of the recovery loop
    When the attributes of other objects it assigns a callable to are listed
    Then there are none: a stage tells another what happened by emitting an event, and the
    composition root declares who reacts in one table (recovery/reactions.py, service.py)."""
    found = [hit for path in _sources(ROOT / REACTING_PACKAGE)
             for hit in hooks_assigned(path.read_text(), _relative(path))]
    assert not found, f"emit an event (recovery.reactions) instead of patching a hook in: {found}"


@pytest.mark.parametrize("snippet", ["self.gang.on_started = self.on_started",
                                     "gang.on_start_failed = self._start_failed",
                                     "self.cordons.before_sweep = lambda read: 'x'"])
def test_the_hook_check_finds_a_hook_patched_in(snippet: str) -> None:
    assert hooks_assigned(snippet, "x.py")


def test_the_hook_check_leaves_data_alone() -> None:
    data = "instance.boot_time = boot\nself.deps.metrics = metrics\nself.x = self.y"
    assert not hooks_assigned(data, "x.py")
