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
    "trainhouse": ["Run", "__version__", "init"],
    "trainhouse.sdk": [
        "Checkpointer",
        "Run",
        "SaveHandle",
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
    "trainhouse.client": ["DEFAULT_URL", "Client", "current_user", "default_url"],
    "trainhouse.frames": ["JobList", "Metrics"],
    "trainhouse.errors": [
        "ArchiveError",
        "BadReplica",
        "BodyTooLarge",
        "CheckpointError",
        "ClientError",
        "ExecutorUnavailable",
        "Forbidden",
        "InvalidMetrics",
        "InvalidQuery",
        "InvalidTransition",
        "ModelError",
        "NotFound",
        "RateLimited",
        "RayUnavailable",
        "ReplicaFailed",
        "ResourceError",
        "ServerBusy",
        "ServerStartError",
        "ServerUnreachable",
        "ServiceUnavailable",
        "SpecError",
        "StoreError",
        "TrainhouseError",
        "Unauthorized",
        "UploadTooLarge",
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

# the layers under the public modules (docs/architecture.md): named for what they are, imported
# by trainhouse's own packages, not part of the contract users rely on
DOMAIN = {
    "trainhouse.cluster",
    "trainhouse.envcache",
    "trainhouse.envs",
    "trainhouse.jobfiles",
    "trainhouse.joblogs",
    "trainhouse.layout",
    "trainhouse.searchspec",
    "trainhouse.modelfiles",
    "trainhouse.runquery",
    "trainhouse.service",
    "trainhouse.serverprocess",
    "trainhouse.storage",
    "trainhouse.tokens",
    "trainhouse.workdir",
}
# internal packages: the server side and the command line, documented as a whole
INTERNAL_PACKAGES = {
    "trainhouse.cli",
    "trainhouse.executors",
    "trainhouse.monitoring",
    "trainhouse.scheduler",
    "trainhouse.server",
    "trainhouse.serving",
    "trainhouse.store",
    "trainhouse.tune",
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_the_public_surface_is_pinned(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is exported but missing"
    # everything public the module defines itself is exported (nothing public by accident)
    for name, value in vars(mod).items():
        if name.startswith("_") or getattr(value, "__module__", None) != module:
            continue
        assert name in mod.__all__, f"{module}.{name} is public by name but not in __all__"


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
            or module in DOMAIN
            or module in INTERNAL_PACKAGES
        ), (
            f"{module} is neither pinned public, nor a domain module, nor private by name "
            "(a leading underscore)"
        )


def test_the_sdk_is_loaded_on_first_use() -> None:
    assert trainhouse.init is importlib.import_module("trainhouse.sdk").init
    assert "init" in dir(trainhouse) and "Run" in dir(trainhouse)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        trainhouse.nothing  # type: ignore[attr-defined]  # noqa: B018
