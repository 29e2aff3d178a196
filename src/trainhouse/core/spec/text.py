"""Reading a job spec from YAML (or JSON) text: bounded before parsing (size, nesting, no
aliases), ``--set`` overrides applied by dotted path, and errors that name the file, the line
and the field (with a "did you mean" for a misspelt key)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trainhouse.core.errors import SpecError, TrainhouseError
from trainhouse.core.spec.model import MAX_SPEC_BYTES, MAX_SPEC_DEPTH, JobSpec, _show

# libyaml's parser when PyYAML has it: a spec of the maximum size is scanned several times faster
_FastLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _prescan(text: str) -> None:
    """Refuse aliases and deep nesting from the event stream, before any node is built: an
    alias bomb never expands, and nesting cannot exhaust the recursive composer (or the C
    stack under libyaml's)."""
    depth = 0
    for event in yaml.parse(text, Loader=_FastLoader):
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in a job spec", mark
            )
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            depth += 1
            if depth > MAX_SPEC_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"mappings and lists nest deeper than {MAX_SPEC_DEPTH} levels here; a job "
                    f"spec may nest at most {MAX_SPEC_DEPTH}",
                    mark,
                )
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            depth -= 1


class _SpecLoader(yaml.SafeLoader):
    """Safe YAML without aliases: a job spec needs none, and nested aliases can expand a few
    hundred bytes into gigabytes. (``parse_spec`` also refuses them in ``_prescan``; this loader
    reads ``--set`` values.)"""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in a job spec", event.start_mark
            )
        node: yaml.Node | None = super().compose_node(parent, index)
        return node


class _Lines:
    """Maps a path of keys in a YAML document to the line it was written on."""

    def __init__(self, node: yaml.Node | None) -> None:
        self.root = node

    def line(self, loc: tuple[str | int, ...]) -> int | None:
        node = self.root
        best: int | None = node.start_mark.line + 1 if node is not None else None
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                for key, val in node.value:
                    if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                        best = key.start_mark.line + 1
                        node = val
                        break
                else:
                    return best
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if part >= len(node.value):
                    return best
                node = node.value[part]
                best = node.start_mark.line + 1
            else:
                return best
        return best


def _first_duplicate_key(node: yaml.Node | None) -> tuple[str, int, int] | None:
    """A key written twice in one mapping (YAML keeps the last silently): (key, line, line)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                line = key.start_mark.line + 1
                if key.value in seen:
                    return key.value, seen[key.value], line
                seen[key.value] = line
            found = _first_duplicate_key(value)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found = _first_duplicate_key(item)
            if found:
                return found
    return None


def _format_errors(exc: ValidationError, source: str, lines: _Lines, overridden: set[str]) -> str:
    messages = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function"))
        field = ".".join(str(p) for p in loc) or "(spec)"
        if err["type"] == "extra_forbidden":
            msg = f"unknown key {field!r}"
            allowed = _allowed_keys(loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
            if close:
                msg += f"; did you mean {close[0]!r}?"
            if allowed:
                msg += f" (allowed: {', '.join(allowed)})"
        else:
            text = str(err["msg"])
            text = text.removeprefix("Value error, ")
            if field == "(spec)" or text.startswith(f"{field}."):
                msg = text  # a rule across fields: its text names them
            elif err["type"] == "missing":
                msg = f"{field} is required"
            else:
                got = err.get("input")
                show = (
                    "" if isinstance(got, dict | list) or "got " in text else f", got {_show(got)}"
                )
                msg = f"{field} {_lower_first(text)}{show}"
        where = f"{source}:{lines.line(loc)}" if lines.root is not None else source
        if field in overridden or any(t.startswith(f"{field}.") for t in overridden):
            where = f"--set {field}"
        messages.append(f"{where}: {msg}")
    return "\n".join(messages)


def _lower_first(text: str) -> str:
    text = text.replace("Input should be", "must be").replace("String should", "must")
    return text[:1].lower() + text[1:]


def _allowed_keys(loc: tuple[str | int, ...]) -> list[str]:
    model: type[BaseModel] = JobSpec
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = field.annotation if field else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return []
    return sorted(model.model_fields)


def read_yaml(text: str, source: str, error: type[TrainhouseError]) -> tuple[Any, yaml.Node | None]:
    """YAML text as plain data and its node tree (for the lines of errors): no aliases, bounded
    nesting, no key given twice; ``error`` naming the file and the line otherwise."""
    try:
        _prescan(text)
        loader = _FastLoader(text)  # a safe loader: plain data only
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"{where}: not valid YAML: {problem}") from None
    except (ValueError, OverflowError) as exc:  # an integer of 5000 digits, a 13th month
        raise error(f"{source}: not valid YAML: {exc}") from None
    duplicate = _first_duplicate_key(node)
    if duplicate is not None:
        key, first, second = duplicate
        raise error(f"{source}:{second}: key {key!r} is given twice (first on line {first})")
    return data, node


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b=value`` into (["a", "b"], parsed value); the value is read as YAML."""
    if "=" not in item:
        raise SpecError(f"--set expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in path):
        raise SpecError(f"--set key must be a dotted path such as hparams.lr, got {key!r}")
    try:
        if raw.strip():
            _prescan(raw)  # no aliases, bounded nesting: as in a spec
            value = yaml.load(raw, Loader=_SpecLoader)
        else:
            value = ""
    except (yaml.YAMLError, ValueError, OverflowError):
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> set[str]:
    """Apply ``--set`` overrides in place; returns the dotted keys that were set."""
    touched = set()
    for item in overrides:
        path, value = parse_override(item)
        node: Any = data
        for i, part in enumerate(path[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                where = ".".join(path[: i + 1])
                raise SpecError(f"--set {'.'.join(path)}: {where} is not a mapping")
            node = nxt
        node[path[-1]] = value
        touched.add(".".join(path))
    return touched


def parse_spec(text: str, *, source: str = "<spec>", overrides: list[str] | None = None) -> JobSpec:
    """Parse and validate YAML (or JSON) text into a JobSpec, or raise SpecError."""
    if len(text) > MAX_SPEC_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        size = len(text.encode("utf-8", "surrogatepass"))
        raise SpecError(
            f"{source}: a job spec may be at most {MAX_SPEC_BYTES // 1024} KiB "
            f"({MAX_SPEC_BYTES} bytes), got {size} bytes; keep data in the workdir"
        )
    data, node = read_yaml(text, source, SpecError)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(
            f"{source}: a job spec must be a mapping of keys, got {type(data).__name__}"
        )
    touched = apply_overrides(data, overrides or [])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(exc, source, _Lines(node), touched)) from None


def load_spec(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    """Load a spec file; errors name the file, the line and the field."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise SpecError(
                f"spec file {path} is {path.stat().st_size} bytes; a job spec may be at most "
                f"{MAX_SPEC_BYTES // 1024} KiB ({MAX_SPEC_BYTES} bytes)"
            )
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"spec file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read spec file {path}: {exc}") from None
    return parse_spec(text, source=str(path), overrides=overrides)


def json_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()
