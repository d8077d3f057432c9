"""An experiment's configuration: one dataclass whose fields are its command's options and its manifest's settings.

Each field is declared with `option(...)`: the flag, the help line, the parser (the name of an argparse `type`
in `corelens/commands/argtypes.py`, or `(factory name, *arguments)`, or a plain callable such as `int`) and
the choices (from `corelens/choices.py`). `corelens.commands.options.add_config` turns the fields, in their
order, into the command's options and help; `from_args` builds the config back from the parsed namespace;
`settings(config)` is the part of the manifest the fields make (fields with `setting=False`, such as the output
folder or the resource bounds, are options only).

A field whose `group` is set is not one option but a block the commands share (`"model"`: --model and the
options that load it). This module imports nothing from the command layer: parsers are named, not imported.

Examples:
    >>> from dataclasses import dataclass
    >>> from corelens.runs.fields import option, settings
    >>> @dataclass(frozen=True)
    ... class Toy:
    ...     k: str = option("1%", help="set sizes", type="k_list")
    ...     out: str = option(None, help="run directory", setting=False)
    >>> settings(Toy(k="2"))
    {'k': '2'}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

REQUIRED = dataclasses.MISSING  # an option without a default: required on the command line


def option(
    default: Any = REQUIRED,
    *,
    help: str = "",
    flag: str | None = None,
    aliases: Sequence[str] = (),
    type: str | tuple | Callable[[str], Any] | None = None,
    choices: Sequence[str] | None = None,
    action: str | None = None,
    nargs: str | None = None,
    metavar: str | None = None,
    setting: bool = True,
    group: str | None = None,
    positional: bool = False,
    cli: bool = True,
) -> Any:
    """Return a dataclass field that is also a command-line option (and, with `setting`, a manifest setting).

    `flag` defaults to `--field-name`; `aliases` are further spellings (`--n` beside `--limit`); a required
    option has no `default`; `action="store_true"` makes a flag; `positional` a positional argument;
    `cli=False` a field set from Python only.
    """
    meta = {
        "help": help,
        "flag": flag,
        "aliases": tuple(aliases),
        "type": type,
        "choices": tuple(choices) if choices is not None else None,
        "action": action,
        "nargs": nargs,
        "metavar": metavar,
        "setting": setting,
        "group": group,
        "positional": positional,
        "cli": cli,
        "required": default is REQUIRED,
    }
    if default is REQUIRED:
        return dataclasses.field(default=None, metadata={"corelens": meta})
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type_copy(default), metadata={"corelens": meta})
    return dataclasses.field(default=default, metadata={"corelens": meta})


def type_copy(value):
    """A fresh copy of a mutable default (each config owns its own list)."""
    return value.copy()


def meta(f: dataclasses.Field) -> dict:
    """Return the `option` metadata of field `f` (an empty dict for a plain field)."""
    return f.metadata.get("corelens", {})


def options(config: type | object) -> list[tuple[dataclasses.Field, dict]]:
    """Return the fields of `config` (a class or instance) that are command-line options, in order."""
    return [(f, meta(f)) for f in dataclasses.fields(config) if meta(f) and meta(f)["cli"]]


def settings(config: object, *names: str) -> dict:
    """Return the manifest settings of `config`: its `setting` fields (or only `names`, in that order)."""
    if names:
        return {name: getattr(config, name) for name in names}
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if meta(f).get("setting")}


def from_mapping(cls: type, values: dict) -> Any:
    """Build `cls` from the values of its fields in `values` (a parsed namespace's `vars`); others are left out."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    return cls(**{k: v for k, v in values.items() if k in names})


# The options every run command shares, declared once; each config places them where its help lists them.


def data_option(help: str = "samples (JSONL)") -> Any:
    """--data: the samples file (a setting through `model_data_settings`, so not one of its own)."""
    return option(help=help, type="samples_path", setting=False)


def out_option() -> Any:
    """--out: the run folder."""
    return option(help="run directory (resumed if it exists)", type="output_path", setting=False)


def limit_option(help: str = "use the first N good samples") -> Any:
    """--limit: how many good samples to use."""
    return option(None, help=help, type=int)


def skip_bad_option() -> Any:
    """--skip-bad: log and skip a bad sample instead of stopping."""
    return option(False, help="log and skip bad samples instead of stopping", action="store_true")


def repair_log_option() -> Any:
    """--repair-log: drop the damaged lines of the run's logs before resuming."""
    return option(
        False,
        help="drop the damaged lines of the run's logs before resuming (a copy, samples.jsonl.bak-TIME, is kept)",
        action="store_true",
        setting=False,
    )


def limits_options() -> tuple[Any, Any]:
    """--max-pixels and --max-pages, the per-sample resource bounds (docs/methods.md#resource-limits)."""
    from corelens.data.sample import Limits

    pixels = option(
        Limits.max_pixels,
        help=f"refuse (or with --skip-bad skip) an image above N pixels, from its header (default {Limits.max_pixels:,})",
        type="positive",
        setting=False,
    )
    pages = option(
        Limits.max_pages,
        help=f"refuse (or skip) a sample of more than N images / pages / frames (default {Limits.max_pages:,})",
        type="positive",
        setting=False,
    )
    return pixels, pages


@dataclass(frozen=True)
class RunOptions:
    """The options of the run context that most experiment commands list together, in this order: they set
    the `RunContext` (`corelens.runs.context`), not the experiment's config."""

    limit: int | None = limit_option()
    skip_bad: bool = skip_bad_option()
    repair_log: bool = repair_log_option()
    max_pixels: int = limits_options()[0]
    max_pages: int = limits_options()[1]


def run_options(limit_help: str = "use the first N good samples") -> Any:
    """--limit, --skip-bad, --repair-log, --max-pixels and --max-pages (`RunOptions`): one block."""
    return option(None, group="run", help=limit_help, setting=False)


def model_option() -> Any:
    """--model and the options that load it (--revision, --device, --dtype, ...): one block, added by the command."""
    return option(group="model", setting=False)
