"""A command's options, generated from its experiment's config dataclass (`corelens.runs.fields.option`).

`add_config(parser, Config)` adds one option per field, in field order: the flag, help, default, choices,
action and the argparse `type` named in the field (a function of `corelens.commands.argtypes`, a
`(factory, *arguments)` tuple such as `("names_of", SETS, "head set")`, or a callable). A field of group
`"model"` adds the shared model block (`add_model_options`). `config_of(Config, args)` builds the config back
from the parsed arguments; `context_of(args)` the `RunContext` every run command passes to its experiment.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, NamedTuple

from corelens.commands import argtypes
from corelens.commands.shared import add_model_options, limits_of, load_options, main_process, progress_lines
from corelens.experiment_registry import Experiment


def parser_type(spec: Any):
    """Return the argparse `type` a field names: an argtypes function, a factory call, or the callable itself."""
    if spec is None or callable(spec):
        return spec
    if isinstance(spec, str):
        return getattr(argtypes, spec)
    name, *arguments = spec
    return getattr(argtypes, name)(*arguments)


# The help's sections, in order, and the options each holds (by flag); any other option is the method's.
SECTIONS = ("model", "data", "method", "statistics", "output")
SECTION_OF = {
    **dict.fromkeys(
        "--data --heads --limit --skip-bad --max-pixels --max-pages --reference runs".split(), "data"
    ),
    **dict.fromkeys("--allow-same-data".split(), "data"),
    **dict.fromkeys(
        "--draws --control-width --max-draws --seed --random-from --n-boot".split(), "statistics"
    ),
    **dict.fromkeys("--rank-resamples --stable-p --k --pairs".split(), "statistics"),
    **dict.fromkeys("--out --repair-log --overlays --explorer --curve".split(), "output"),
}


def sections(parser: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    """Return the help sections of `parser` (argument groups, made once, in `SECTIONS` order)."""
    made = getattr(parser, "_corelens_sections", None)
    if made is None:
        made = {name: parser.add_argument_group(f"{name} options") for name in SECTIONS}
        parser._corelens_sections = made
    return made


def add_config(parser: argparse.ArgumentParser, config: type, helps: dict[str, str] | None = None) -> None:
    """Add the options of `config`'s fields to `parser`, in field order (`helps`: help lines replaced), each
    in its help section (`SECTION_OF`: model, data, method, statistics, output)."""
    # Imported here, when a command's parser is made: `corelens demo --help` (a command kept in one module
    # with the experiment commands) does not pay for the config fields' modules.
    from corelens.runs.fields import RunOptions, options

    groups = sections(parser)
    for f, meta in options(config):
        if meta["group"] == "model":
            add_model_options(groups["model"])
            continue
        if meta["group"] == "run":  # the run context's block; this config words its --limit
            add_config(parser, RunOptions, {"limit": meta["help"]})
            continue
        if helps and f.name in helps:
            meta = {**meta, "help": helps[f.name]}
        flag = meta["action"] in ("store_true", "store_false")  # a flag takes no value, so no type
        kwargs: dict[str, Any] = {"help": meta["help"]}
        for key in ("action", "choices", "nargs", "metavar"):
            if meta[key] is not None:
                kwargs[key] = meta[key]
        if not flag and meta["type"] is not None:
            kwargs["type"] = parser_type(meta["type"])
        if meta["positional"]:
            groups[SECTION_OF.get(f.name, "data")].add_argument(f.name, **kwargs)
            continue
        if meta["required"]:
            kwargs["required"] = True
        elif not flag:
            kwargs["default"] = f.default
        name = meta["flag"] or "--" + f.name.replace("_", "-")
        groups[SECTION_OF.get(name, "method")].add_argument(name, *meta["aliases"], dest=f.name, **kwargs)


def config_of(config: type, args: argparse.Namespace):
    """Return the `config` dataclass filled from parsed `args`."""
    from corelens.runs.fields import from_mapping

    return from_mapping(config, vars(args))


def context_of(args: argparse.Namespace, progress: bool = True):
    """Return the `RunContext` of a run command: --out, --limit, --skip-bad, the resource bounds, sys.argv."""
    from corelens.runs.context import RunContext

    return RunContext(
        out=getattr(args, "out", None),
        argv=sys.argv,
        progress=progress,
        skip_bad=getattr(args, "skip_bad", False),
        limit=getattr(args, "limit", None),
        limits=limits_of(args),
    )


def named(path: str):
    """Return the object `module:name` names (imported only when a command is parsed or run)."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


class Command(NamedTuple):
    """A command kept in a module beside others (`COMMANDS`' `module:name`): what a command's own module has."""

    run: Callable[[argparse.Namespace], None]  # the parser's `func`: runs the parsed command
    register: Callable[[Any], None]  # register(subparsers) adds the command's parser


def experiment_command(experiment: Experiment) -> Command:
    """Return the `Command` (run, register) of a registered experiment (`corelens.experiment_registry`): the
    generic driver and parser specialised with `functools.partial` to its config ("module:Class"), entry point
    ("module:function") and printer ("module:function")."""
    e = experiment
    run = partial(run_experiment, config=e.config, entry=e.run, show=e.show)
    return Command(run, partial(register_experiment, name=e.name, help=e.help, config=e.config, run=run))


def register_experiment(sub, *, name: str, help: str, config: str, run) -> argparse.ArgumentParser:
    """Add the parser of experiment command `name`: its options are the fields of `config` ("module:Class")."""
    parser = sub.add_parser(name, help=help)
    add_config(parser, named(config))
    parser.set_defaults(func=run)
    return parser


@contextmanager
def said(what: str) -> Iterator[None]:
    """Print `what` on standard error (rank 0 only), then how many seconds the block took, on the same line."""
    main = os.environ.get("RANK", "0") == "0" and progress_lines()
    if main:
        print(f"{what} ...", end="", file=sys.stderr, flush=True)
    started = time.perf_counter()
    yield
    if main:
        print(f" {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


def run_experiment(args: argparse.Namespace, *, config: str, entry: str, show: str) -> None:
    """The one command driver: build the config and the run context from `args`, call the experiment's
    `entry(config, ctx, load_options)` ("module:function"), and on the main process `show(result, config)`
    ("module:function").

    Each experiment command is this driver specialised with `functools.partial` (as TransformerLens
    specialises one generic patching driver): only its config, its entry point and what it prints differ.
    """
    cfg = config_of(named(config), args)
    loads = load_options(args) if hasattr(args, "revision") else {}  # stability loads no model
    if main_process():
        from corelens.commands.preflight import check_rerun

        # A rerun with other settings (or another command) in --out: refused before torch and the model load.
        check_rerun(args.command, cfg, getattr(args, "out", None), add_config)
    with said(f"corelens {args.command}: importing torch and transformers"):  # seconds, before any output
        run = named(entry)
    result = run(cfg, context_of(args), loads)
    if main_process():
        named(show)(result, cfg)
