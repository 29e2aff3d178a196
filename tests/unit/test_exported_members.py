"""The public surface, pinned (as httpx's test_exported_members.py does): what a user may import
from trainhouse, exactly, and that everything else in the user-facing packages is private by name.

Changing a line here changes the public contract: say so in the change's note.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import trainhouse

PUBLIC: dict[str, list[str]] = {
    "trainhouse": ["Histogram", "Image", "Run", "Table", "__version__", "init"],
    "trainhouse.sdk": [
        "Checkpointer",
        "Histogram",
        "Image",
        "Run",
        "SaveHandle",
        "Table",
        "init",
        "load_checkpoint",
        "load_model",
    ],
    "trainhouse.sdk.data": ["ResumableSampler"],
    "trainhouse.sdk.checkpoint": [
        "DISK_FULL",
        "RESERVED",
        "Checkpointer",
        "SaveHandle",
        "dir_name",
        "file_name",
        "load_checkpoint",
        "refuse_unloadable",
        "safe_load",
    ],
    # the errors a call raises, as scripts catch them (`from trainhouse.client import
    # ClientError`, which tests/browser/test_services_page.py does)
    "trainhouse.client": [
        "DEFAULT_URL",
        "Client",
        "ClientError",
        "ServerUnreachable",
        "current_user",
        "default_url",
    ],
    "trainhouse.frames": ["JobList", "Metrics"],
    "trainhouse.errors": [
        "AlreadyExists",
        "ArtifactTooLarge",
        "ArchiveError",
        "BadInput",
        "BadReplica",
        "BodyTooLarge",
        "CheckpointError",
        "ClientError",
        "DatasetError",
        "EnvBuildError",
        "ExecutorUnavailable",
        "ExportFailed",
        "FlowError",
        "Forbidden",
        "InvalidMedia",
        "InvalidMetrics",
        "InvalidQuery",
        "InvalidTracking",
        "InvalidTransition",
        "MlflowError",
        "ModelError",
        "NotEncodable",
        "NotFound",
        "QueryError",
        "RateLimited",
        "RayUnavailable",
        "Refused",
        "ReplicaFailed",
        "ResourceError",
        "ServerBusy",
        "ServerStartError",
        "ServerUnreachable",
        "ServiceUnavailable",
        "SpecError",
        "StagingError",
        "StoreError",
        "TrainhouseError",
        "Unauthorized",
        "UnsafeFile",
        "UploadTooLarge",
        "ValueChanged",
    ],
    "trainhouse.lifecycle": [
        "RESUMABLE",
        "TERMINAL",
        "TRANSITIONS",
        "AttemptResult",
        "FailureKind",
        "JobState",
        "StopReason",
        "check_transition",
    ],
    "trainhouse.spec": [
        "DEFAULT_NO_RESTART_EXIT_CODES",
        "DEFAULT_NO_RESTART_PATTERNS",
        "MAX_ENTRYPOINT",
        "MAX_ENV_NAME",
        "MAX_ENV_VALUE",
        "MAX_ENV_VARS",
        "MAX_HPARAMS_BYTES",
        "MAX_METRIC_NAME",
        "MAX_RUNTIME",
        "MAX_SPEC_BYTES",
        "MAX_SPEC_DEPTH",
        "MAX_TAGS",
        "MAX_WORKDIR",
        "PRIORITY_TIERS",
        "RESERVED_ENV",
        "TAG",
        "CheckpointPolicy",
        "Environment",
        "JobSpec",
        "NoRestart",
        "Priority",
        "Resources",
        "apply_overrides",
        "check_tags",
        "json_schema",
        "load_spec",
        "parse_duration",
        "parse_override",
        "parse_spec",
        "tier_rank",
    ],
    "trainhouse.server": ["Settings", "create_app"],
    "trainhouse.integrations": [],
}

# the integrations of the optional extras: pinned from their source (importing transformers or
# lightning here would cost the unit tests seconds; the integration tests import them for real)
PUBLIC_BY_SOURCE: dict[str, list[str]] = {
    "trainhouse.integrations.transformers": ["TrainhouseCallback"],
    "trainhouse.integrations.lightning": ["TrainhouseCallback", "TrainhouseLogger"],
}

# the public paths that are the user's name for a module of the bottom layer: each re-exports
# exactly what its module exports
PUBLIC_PATHS = {
    "trainhouse.errors": "trainhouse.core.errors",
    "trainhouse.frames": "trainhouse.client.frames",
    "trainhouse.lifecycle": "trainhouse.core.lifecycle",
    "trainhouse.spec": "trainhouse.core.spec",
}
# the only modules loose at the top of the package: the package, its entry point, the public
# paths above (docs/architecture.md: everything else lives in a package named for its role)
LOOSE = {"trainhouse.__main__", *PUBLIC_PATHS}
# internal packages: the layers under the public modules, the server side and the command line,
# documented as a whole (docs/architecture.md), imported by trainhouse's own packages, not part
# of the contract users rely on
INTERNAL_PACKAGES = {
    "trainhouse.cli",
    "trainhouse.core",
    "trainhouse.executors",
    "trainhouse.ingest",
    "trainhouse.jobfs",
    "trainhouse.monitoring",
    "trainhouse.scheduler",
    "trainhouse.server",
    "trainhouse.serving",
    "trainhouse.store",
    "trainhouse.tune",
    "trainhouse.usecases",
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_the_public_surface_is_pinned(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is exported but missing"
    # everything public the module defines itself is exported (nothing public by accident)
    source = PUBLIC_PATHS.get(module, module)
    defining = importlib.import_module(source)
    for name, value in vars(defining).items():
        home = getattr(value, "__module__", None) or ""
        if name.startswith("_") or not (home == source or home.startswith(source + ".")):
            continue  # a package's names count as its own (trainhouse.core.spec.model's)
        assert name in mod.__all__, f"{source}.{name} is public by name but not in __all__"


@pytest.mark.parametrize("module", sorted(PUBLIC_PATHS))
def test_a_public_path_is_its_module(module: str) -> None:
    mod = importlib.import_module(module)
    source = importlib.import_module(PUBLIC_PATHS[module])
    assert mod.__all__ == source.__all__
    for name in mod.__all__:
        assert getattr(mod, name) is getattr(source, name)


def test_at_most_six_modules_are_loose_at_the_top() -> None:
    root = Path(trainhouse.__file__).parent
    loose = {f"trainhouse.{p.stem}" for p in root.glob("*.py") if p.stem != "__init__"}
    assert loose == LOOSE
    assert len(loose) + 1 <= 6  # and the package's own __init__


@pytest.mark.parametrize("module", sorted(PUBLIC_BY_SOURCE))
def test_the_integrations_surface_is_pinned(module: str) -> None:
    source = Path(trainhouse.__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
    tree = ast.parse(source.read_text())
    exported: list[str] = []
    defined: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            exported = list(ast.literal_eval(node.value))
        elif isinstance(node, ast.ClassDef | ast.FunctionDef):
            defined.append(node.name)
    assert sorted(exported) == sorted(PUBLIC_BY_SOURCE[module])
    assert set(exported) <= set(defined)
    public = [name for name in defined if not name.startswith("_")]
    assert sorted(public) == sorted(exported), f"{module} defines public names not in __all__"


def _modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return [
        f"{package}.{info.name}"
        for info in pkgutil.iter_modules([str(Path(p)) for p in pkg.__path__])
    ]


@pytest.mark.parametrize(
    "package",
    ["trainhouse", "trainhouse.sdk", "trainhouse.sdk.checkpoint", "trainhouse.integrations"],
)
def test_modules_of_the_user_facing_packages_are_public_or_private_by_name(package: str) -> None:
    for module in _modules(package):
        short = module.rsplit(".", 1)[1]
        if short.startswith("_"):
            continue
        assert (
            module in PUBLIC
            or module in PUBLIC_BY_SOURCE
            or module in LOOSE
            or module in INTERNAL_PACKAGES
        ), (
            f"{module} is neither pinned public, nor an internal package, nor private by name "
            "(a leading underscore)"
        )


def test_the_sdk_is_loaded_on_first_use() -> None:
    assert trainhouse.init is importlib.import_module("trainhouse.sdk").init
    assert "init" in dir(trainhouse) and "Run" in dir(trainhouse)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        trainhouse.nothing  # type: ignore[attr-defined]  # noqa: B018
