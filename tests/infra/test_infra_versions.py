"""What is tested is what runs: the deployed Powertools layer is the release the tests use."""

from __future__ import annotations

import ast
import sys
from importlib import metadata
from pathlib import Path

import pytest
from infra_synth import Synth

from infra import LAMBDAS_DIR, REPO_ROOT
from infra.lambda_common import POWERTOOLS_PACKAGE, pinned_version, powertools_parameter_name

# What the Lambda environment provides: the python3.12 runtime (boto3 and its
# dependencies) and the Powertools layer (Powertools, its dependencies and the extras
# tracer / parser / validation). Anything else would fail at import in AWS.
RUNTIME_MODULES = {"boto3", "botocore", "jmespath", "dateutil", "urllib3", "s3transfer"}
LAYER_MODULES = {"aws_lambda_powertools", "typing_extensions", "pydantic", "pydantic_core",
                 "aws_xray_sdk", "wrapt", "fastjsonschema"}
FIRST_PARTY = {"gpu_recovery", "handlers"}


def _layer_parameters(synth: Synth) -> set[str]:
    """The SSM parameter names the functions' public layers are resolved from (a deployment's
    own fault-catalog layer, when it has one, is an asset of this stack, not a parameter)."""
    parameters = synth.template.get("Parameters", {})
    names = set()
    for fn in synth.resources("AWS::Lambda::Function").values():
        public = [layer for layer in fn["Properties"]["Layers"]
                  if isinstance(layer, dict) and "Ref" in layer and layer["Ref"] in parameters]
        assert len(public) == 1, f"expected one Powertools layer, got {fn['Properties']['Layers']}"
        parameter = parameters[public[0]["Ref"]]
        assert parameter["Type"] == "AWS::SSM::Parameter::Value<String>"
        names.add(parameter["Default"])
    return names


def test_deployed_powertools_is_the_tested_version(default_synth: Synth, custom_synth: Synth) -> None:
    """Given requirements.txt, the installed package and both architectures' templates, Then
    every function's layer is the public layer of exactly the Powertools release the tests
    ran with (/aws/service/powertools/python/<arch>/python3.12/<version>)."""
    tested = metadata.version(POWERTOOLS_PACKAGE)
    assert pinned_version(POWERTOOLS_PACKAGE) == tested, "requirements.txt and the venv differ"
    assert _layer_parameters(default_synth) == {
        f"/aws/service/powertools/python/x86_64/python3.12/{tested}"}
    assert _layer_parameters(custom_synth) == {
        f"/aws/service/powertools/python/arm64/python3.12/{tested}"}
    outputs = default_synth.template["Outputs"]
    assert outputs["PowertoolsVersion"]["Value"] == tested
    assert outputs["PowertoolsLayerArn"]["Value"]["Ref"] in default_synth.template["Parameters"]


def test_runtime_of_the_functions_is_the_layer_build(default_synth: Synth) -> None:
    """The layer parameter names the runtime build; the functions run that runtime."""
    for fn in default_synth.resources("AWS::Lambda::Function").values():
        assert fn["Properties"]["Runtime"] == "python3.12"
    expected = "/aws/service/powertools/python/x86_64/python3.12/9.9.9"
    assert powertools_parameter_name("x86_64", "9.9.9") == expected


def test_a_loose_pin_is_refused(tmp_path: Path) -> None:
    """Given requirements that do not pin Powertools with ==, Then synthesis cannot pick a
    layer (the deployed version would not be the tested one)."""
    loose = tmp_path / "requirements.txt"
    loose.write_text("aws-lambda-powertools[tracer]>=3.0\nboto3\n")
    with pytest.raises(ValueError, match="must pin aws-lambda-powertools with '=='"):
        pinned_version(POWERTOOLS_PACKAGE, loose)
    exact = tmp_path / "exact.txt"
    exact.write_text("# comment\naws_lambda_powertools[parser] == 3.1.0  # pinned\n")
    assert pinned_version(POWERTOOLS_PACKAGE, exact) == "3.1.0"
    assert (REPO_ROOT / "requirements.txt").read_text().count("aws-lambda-powertools") == 1


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside a ``try`` that handles ImportError (an optional, synth-time-only import)?"""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                caught = ast.walk(handler.type) if handler.type else ()
                names = {n.id for n in caught if isinstance(n, ast.Name)}
                if names & {"ImportError", "ModuleNotFoundError"}:
                    return True
    return False


def test_lambdas_import_only_what_runtime_and_layer_provide() -> None:
    """Every module the Lambda asset imports comes from the standard library, the asset, the
    Lambda runtime or the Powertools layer; anything else only behind ``except ImportError``."""
    allowed = set(sys.stdlib_module_names) | FIRST_PARTY | RUNTIME_MODULES | LAYER_MODULES
    offenders = []
    for path in sorted(LAMBDAS_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in allowed and top != "__future__" and not _guarded(node, parents):
                    offenders.append(f"{path.relative_to(LAMBDAS_DIR)}:{node.lineno} imports {module}")
    assert not offenders, offenders
