"""The job spec: a pydantic model plus YAML loading whose errors name the field and the line.

A spec is written by users as YAML (see ``examples/digits/trainhouse.yaml``); ``--set key=value``
overrides any field by dotted path before validation. The JSON Schema is published by
``trainhouse spec --schema``.

Specs arrive over HTTP, so every part is bounded: the text (``MAX_SPEC_BYTES``), its nesting
(``MAX_SPEC_DEPTH``; YAML aliases are refused outright, so no alias bomb can expand), the
hparams as JSON (``MAX_HPARAMS_BYTES``), the env (``MAX_ENV_VARS`` variables, names up to
``MAX_ENV_NAME`` and values up to ``MAX_ENV_VALUE`` characters), the entrypoint
(``MAX_ENTRYPOINT``) and every other string field.

The model is :mod:`.model`, reading text into it :mod:`.text`; every public name is importable
from here (and from :mod:`trainhouse.spec`).
"""

from trainhouse.core.spec.model import (
    DEFAULT_NO_RESTART_EXIT_CODES,
    DEFAULT_NO_RESTART_PATTERNS,
    MAX_ENTRYPOINT,
    MAX_ENV_NAME,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
    MAX_HPARAMS_BYTES,
    MAX_METRIC_NAME,
    MAX_RUNTIME,
    MAX_SPEC_BYTES,
    MAX_SPEC_DEPTH,
    MAX_TAGS,
    MAX_WORKDIR,
    PRIORITY_TIERS,
    RESERVED_ENV,
    TAG,
    CheckpointPolicy,
    Environment,
    JobSpec,
    NoRestart,
    Priority,
    Resources,
    check_tags,
    parse_duration,
    tier_rank,
)
from trainhouse.core.spec.text import (
    apply_overrides,
    json_schema,
    load_spec,
    parse_override,
    parse_spec,
)

__all__ = [
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
]
