"""A command group whose commands load on first use: ``trainhouse --help`` lists every command
from a table and imports none of their modules; ``trainhouse ps`` imports the one module ``ps``
is in.

Why: importing every noun module up front (with the rich tables, the executor registry and the
lifecycle rules they import) and making all of their ~50 click commands was most of what the
CLI did before it even parsed its arguments. The table says, for each command, its noun module,
whether that module's app is the command (a group: ``models list``) or holds it among other
top-level commands, and the line ``--help`` shows for it (the first paragraph of its help).
``tests/unit/test_cli_start.py`` checks the table against the modules and the help it lists
against the help of the commands themselves, so that it cannot drift, and pins what ``--help``
and ``ps`` import.

The root's help also imports typer's help renderer without the two rich modules it imports but
never uses here (:func:`import_help_renderer`).
"""

from __future__ import annotations

import copy
import importlib
import sys
import types
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    from typer._click import Command, Context, HelpFormatter  # typer's own copy of click


@dataclass(frozen=True)
class Listed:
    """A command of the table: where it is, and what ``--help`` says of it."""

    module: str  # its noun module, under the group's package
    help: str  # the first paragraph of its help (short_help if it has one), as --help lists it
    group: bool = False  # the module's app is this command, with subcommands (`models list`);
    # else the module's app holds top-level commands, this one among them (`jobs`: `ps`, ...)


class LazyCommands(MutableMapping[str, "Command"]):
    """A group's commands by name, in the table's order (then any added later). Looking a
    listed name up imports its noun module and makes that module's listed commands, once;
    iterating, counting and ``in`` import nothing, so typer's "did you mean" stays free."""

    def __init__(
        self, listed: Mapping[str, Listed], load: Callable[[str], Mapping[str, Command]]
    ) -> None:
        self._load = load
        self._names = list(listed)
        self._known = set(listed)
        self._pending = set(listed)  # listed, not made yet
        self._made: dict[str, Command] = {}

    def made(self, name: str) -> Command | None:
        """The command if it was made already (looked up or added), else None: no import."""
        return self._made.get(name)

    def __getitem__(self, name: str) -> Command:
        if name in self._pending:
            for made, command in self._load(name).items():
                if made in self._pending:
                    self._pending.discard(made)
                    self._made[made] = command
        return self._made[name]  # KeyError: no such command (or its module lacks it)

    def __setitem__(self, name: str, command: Command) -> None:
        if name not in self._known:
            self._names.append(name)
            self._known.add(name)
        self._pending.discard(name)
        self._made[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self._known:
            raise KeyError(name)
        self._names.remove(name)
        self._known.discard(name)
        self._pending.discard(name)
        self._made.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._known

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)


class LazyGroup(TyperGroup):
    """A typer group whose commands are the ``listed`` table's (a subclass sets it), each made
    from its noun module (``package.module``'s ``app``) when first looked up, exactly as
    ``add_typer`` would have made it; commands registered on the app itself come after."""

    listed: ClassVar[Mapping[str, Listed]] = {}
    package: ClassVar[str] = "trainhouse.cli"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        registered = dict(self.commands)
        self.lazy = LazyCommands(self.listed, self._load)
        self.lazy.update(registered)
        self.commands = self.lazy

    def _load(self, name: str) -> dict[str, Command]:
        """The commands of ``name``'s noun module, made as the root app's ``add_typer`` makes
        them (the same markup mode and suggestions): a group, or its top-level commands."""
        entry = self.listed[name]
        module = importlib.import_module(f"{self.package}.{entry.module}")
        holder = typer.Typer(
            rich_markup_mode=self.rich_markup_mode, suggest_commands=self.suggest_commands
        )
        holder.add_typer(module.app, name=name if entry.group else None)
        return dict(typer.main.get_group(holder).commands)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        """typer's help, its list of commands made from the table: the help of a command not
        made yet is its listed line (a command with only a name and that help), so that
        ``--help`` imports no noun module."""
        import_help_renderer()
        listing = copy.copy(self)
        listing.commands = {
            name: self.lazy.made(name) or self._listed_command(name) for name in self.lazy
        }
        super(LazyGroup, listing).format_help(ctx, formatter)

    def _listed_command(self, name: str) -> Command:
        return TyperCommand(
            name=name, help=self.listed[name].help, rich_markup_mode=self.rich_markup_mode
        )


# what typer's help renderer (typer.rich_utils) imports by name but uses only to render markdown
# markup and pretty tracebacks, neither of which this CLI asks for: rich.markdown (markdown-it)
# and rich.traceback (pygments, rich.pretty, attrs) were a third of `trainhouse --help`'s start
_UNUSED_BY_HELP = (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback"))


class _Deferred(type):
    """The type of a stand-in for a rich class: calling it or reading one of its attributes
    (``Traceback.from_exception``) imports the real class and hands the call on to it, so that
    typer's markdown mode and pretty tracebacks still work should anything use them."""

    where: tuple[str, str]  # the real class: its module, its name

    def real(cls) -> type:
        module, name = cls.where
        real: type = getattr(importlib.import_module(module), name)
        return real

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.real()(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(cls.real(), name)


def import_help_renderer() -> None:
    """Import typer's help renderer, ``typer.rich_utils``, with stand-ins (:class:`_Deferred`)
    for the two rich classes it never needs here: they are in ``sys.modules`` only while it is
    imported, so that anything importing rich.markdown or rich.traceback later gets the real
    module. A typer that imports more of those modules than this knows of is imported as it is.
    The root's help calls it; a command's own help or a usage error, when it comes first, has
    typer import its renderer as it is (those are not the start-up ``bench/cli.py`` times).
    """
    if "typer.rich_utils" in sys.modules:
        return
    placed: dict[str, types.ModuleType] = {}
    for module, name in _UNUSED_BY_HELP:
        if module not in sys.modules:
            standin = types.ModuleType(module)
            setattr(standin, name, _Deferred(name, (), {"where": (module, name)}))
            placed[module] = sys.modules[module] = standin
    try:
        importlib.import_module("typer.rich_utils")
    except ImportError:
        _remove(placed)
        importlib.import_module("typer.rich_utils")
    finally:
        _remove(placed)


def _remove(placed: dict[str, types.ModuleType]) -> None:
    for module, standin in placed.items():
        if sys.modules.get(module) is standin:
            del sys.modules[module]
    placed.clear()
