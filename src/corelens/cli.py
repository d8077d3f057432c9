"""Command line: argument parsing only; each command (corelens.commands.*) calls one experiment.

A command's module (and so torch and transformers) is imported only when that command is parsed or its help
is asked for: `corelens --help`, `--version` and a malformed command line answer without them.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import importlib.util
import os
import re
import sys
import traceback
from importlib.metadata import version

from corelens.commands import COMMANDS, EXAMPLES, WORKFLOW, load_command, module_of
from corelens.errors import CorelensError
from corelens.experiment_registry import Experiment

_LEAF = "_corelens_parser"  # namespace attribute: the innermost parser that parsed (for unknown options)


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Help lines that end with the option's default, unless it is None or off, or the line already says it;
    the description and the example below the options are shown as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        shown = action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)
        if not shown or default is None or default is False or default in ("", argparse.SUPPRESS):
            return text  # a positional, a flag, or no default: nothing to show
        if "default" in text:
            return text  # the help states its default in its own words
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """corelens' parsers: help shows defaults; an unknown option or choice names the nearest one; a command's
    options are added (its module imported) only when the command is parsed or its help is shown.

    The suggestions are made here (difflib) for every Python corelens supports: argparse's own
    `suggest_on_error` (Python 3.14) covers only choices, and the installed 3.11 has none.
    """

    def __init__(self, *args, command: str | None = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)
        self.command = command  # the command (corelens.commands.COMMANDS) that has not yet added its options

    def load(self) -> Parser:
        """Add the command's options (import its module) once; return the parser."""
        if self.command is not None:
            name, self.command = self.command, None
            load_command(name).register(_Into(self, name))
        return self

    def parse_known_args(self, args=None, namespace=None):
        self.load()
        if args is not None and self._subparsers is None:
            # A command's own options: a misspelt one is the error to show, before "arguments are required".
            known = [o for action in self._actions for o in action.option_strings]
            unknown = [
                a
                for a in args
                if a.startswith("--") and not any(o.startswith(a.split("=")[0]) for o in known)
            ]
            if unknown:
                self.error(f"unrecognized arguments: {' '.join(unknown)}{_nearest_option(unknown, self)}")
        namespace, extras = super().parse_known_args(args, namespace)
        if not hasattr(namespace, _LEAF):  # the innermost parser returns first: it is the one to name
            setattr(namespace, _LEAF, self)
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        leaf = vars(namespace).pop(_LEAF, self)
        if extras:  # refused by the command that was parsed, with its own usage line
            leaf.error(f"unrecognized arguments: {' '.join(extras)}{_nearest_option(extras, leaf)}")
        return namespace

    def format_usage(self) -> str:
        return self.load() and super().format_usage()

    def format_help(self) -> str:
        return self.load() and super().format_help()

    def error(self, message: str):
        super().error(message + _nearest_choice(message))


class _Into:
    """What a command's `register(sub)` receives: `add_parser` hands back the parser already listed."""

    def __init__(self, parser: Parser, name: str) -> None:
        self.parser, self.name = parser, name

    def add_parser(self, name: str, *, help: str | None = None, **kwargs) -> Parser:  # noqa: A002
        if name != self.name:
            raise RuntimeError(f"{module_of(self.name)}.register added a parser named {name!r}")
        for key, value in kwargs.items():  # description, epilog: as if given when the parser was made
            setattr(self.parser, key, value)
        return self.parser


def _nearest_option(extras: list[str], leaf: argparse.ArgumentParser) -> str:
    """Return "; did you mean --x?" for the first unknown option close to one of `leaf`'s, else ""."""
    known = {o.lstrip("-"): o for action in leaf._actions for o in action.option_strings}
    for extra in extras:
        if extra.startswith("-"):  # compared without the dashes, which every option shares
            close = difflib.get_close_matches(extra.split("=", 1)[0].lstrip("-"), list(known), n=1)
            if close:
                return f"; did you mean {known[close[0]]}?"
    return ""


def _nearest_choice(message: str) -> str:
    """Return "; did you mean 'x'?" for argparse's "invalid choice: 'y' (choose from ...)" message, else ""."""
    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if not found:
        return ""
    choices = [c.strip().strip("'") for c in found.group(2).split(",")]
    close = difflib.get_close_matches(found.group(1), choices, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _summary(name: str) -> str | None:
    """Return the `help=` a command's register() gives its parser: an experiment's registry entry says it,
    another command's is read from its module's source (not imported), an `add_parser(name, help=...)` call."""
    where = COMMANDS[name]
    if isinstance(where, Experiment):
        return where.help
    origin = importlib.util.find_spec(module_of(name)).origin
    with open(origin, encoding="utf-8") as source:
        tree = ast.parse(source.read(), origin)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        given = {k.arg: k.value.value for k in node.keywords if isinstance(k.value, ast.Constant)}
        if getattr(node.func, "attr", None) == "add_parser" and [
            getattr(a, "value", None) for a in node.args[:1]
        ] == [name]:
            return given.get("help")
    return None


def _wrap(text: str) -> str:
    """Return `text` wrapped for the terminal (the help's description and epilog are shown as written)."""
    import textwrap

    return textwrap.fill(text, 78)


def _describe(summary: str | None) -> str | None:
    """Return a command's description: its one-line summary as a sentence."""
    return _wrap(summary[0].upper() + summary[1:] + ".") if summary else None


def parser(lazy: bool = False) -> Parser:
    """Return the corelens argument parser with every command registered (`lazy`: each on first use)."""
    p = Parser(
        prog="corelens", description="Find, test and exploit visual retrieval heads.", epilog=_wrap(WORKFLOW)
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--version", action="version", version=f"%(prog)s {version('corelens')}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        summary = _summary(name)
        child = sub.add_parser(name, help=summary, command=name, description=_describe(summary),
                               epilog=f"example:\n  {EXAMPLES[name]}")  # fmt: skip
        if not lazy:
            child.load()
    return p


# Control characters a dataset field may carry (a VidSTG `vid`, a task label): shown escaped, never sent raw to
# the terminal, where an escape sequence could rewrite what is on screen. Tab, newline and carriage return
# (the progress bar's) pass.
_CONTROLS = {
    c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A, 0x0D)
}


class EscapedStream:
    r"""A text stream that writes control characters escaped (`\x1b`), everything else as it is.

    Examples:
        >>> import io
        >>> out = io.StringIO()
        >>> EscapedStream(out).write("vid \x1b[2Jx\n")
        10
        >>> out.getvalue()
        'vid \\x1b[2Jx\n'
    """

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(text.translate(_CONTROLS))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def escaped_output():
    """Inside the block, standard output and error escape control characters (`EscapedStream`)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapedStream(sys.stdout), EscapedStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def main(argv: list[str] | None = None) -> int:
    """Run the corelens command line; return the exit code (2: a malformed command, or a CorelensError).

    Everything it prints goes through `escaped_output`: no control character from data reaches the terminal.
    """
    with escaped_output(), _info_lines():
        return _main(argv)


@contextlib.contextmanager
def _info_lines():
    """Show corelens' info lines (the model loaded, in how many seconds) on standard error while a command runs,
    when progress lines are shown there (`progress_lines`); from Python they stay silent unless the caller
    configures logging."""
    import logging

    from corelens.commands.shared import progress_lines

    if not progress_lines():
        yield
        return

    logger = logging.getLogger("corelens")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.setLevel(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level or logging.INFO, logging.INFO))
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _main(argv: list[str] | None) -> int:
    try:
        args = parser(lazy=True).parse_args(argv)
    except SystemExit as stop:  # argparse printed the usage and one error line (2), or the help (0)
        return stop.code
    from corelens.runs.dist import launched

    # Under torchrun every rank prints its own error: which rank met it, on a line of its own (rank 0's
    # progress bar may hold the terminal's current line).
    where = f"\ncorelens: error: [rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}] "
    where = where if launched() else "corelens: error: "
    try:
        return _run(args, where)
    finally:
        from corelens.runs.lock import release_all

        release_all()  # the run folder's lock, also when the command failed


def _run(args: argparse.Namespace, where: str) -> int:
    """Run the parsed command; return its exit code (CorelensError: one line, 2; a lost torchrun peer: 1)."""
    from corelens.runs.dist import launched

    try:
        if isinstance(getattr(args, "data", None), str) and args.command != "organism":
            _resolve_data(args)
            from corelens.commands.shared import check_data

            check_data(args)  # no usable sample, or no targets where they are needed: before the model loads
        if args.command not in ("organism", "export"):  # their --model: a folder to build or to re-read
            from corelens.commands.preflight import check_model

            check_model(args)  # the model's folder, family or hub cache: before torch and the model load
        if getattr(args, "repair_log", False):
            _repair_log(args)
        args.func(args)
    except CorelensError as err:
        if args.debug:
            traceback.print_exc()
        print(f"{where}{err}", file=sys.stderr)
        return 2
    except MemoryError:
        # A size no option bound caught (a count within its bound on a small machine): one line, not a traceback.
        if args.debug:
            raise
        print(f"{where}out of memory while running `corelens {args.command}`: ask for fewer draws, resamples or "
              "samples (--n-boot, --draws, --seeds, --limit); finished samples are kept in the run directory",
              file=sys.stderr)  # fmt: skip
        return 2
    except RuntimeError as err:
        # A rank waiting for the others (gloo) hears that one of them died or stopped answering; torchrun
        # ends this one too; the finished samples are in the run's logs.
        if not launched() or args.debug or not _peer_lost(err):
            raise
        print(f"{where}{_peer_message(str(err))}; finished samples are kept in the run directory: run the "
              "same command again to resume", file=sys.stderr)  # fmt: skip
        return 1
    if launched():
        from corelens.runs.dist import close, current

        current().barrier()  # every rank has finished; then leave the group together
        close()
    return 0


def _peer_lost(err: RuntimeError) -> bool:
    """Return True for the error a collective raises when another rank's process has gone or stopped answering."""
    import torch.distributed as dist

    text = str(err)
    lost = ("gloo", "Connection closed by peer", "failed to reach the barrier", "froze inside the barrier",
            "Timed out", "timed out")  # fmt: skip
    return isinstance(err, dist.DistError) or any(sign in text for sign in lost)


def _peer_message(text: str) -> str:
    """Say which rank was lost, when the collective's error names it (gloo's monitored barrier does)."""
    from corelens.runs.dist import TIMEOUT_ENV, timeout

    limit = f"within {timeout().total_seconds():g} s ({TIMEOUT_ENV})"
    if found := re.search(r"ranks ([\d, ]+) (?:failed to reach|froze inside) the barrier", text):
        ranks = ", ".join(r.strip() for r in found.group(1).split(",") if r.strip())
        return f"rank {ranks} did not answer {limit}"
    if found := re.search(r"from rank (\d+)", text):
        # This rank reached the barrier; the rank it waited for ended or stopped answering.
        return f"rank {found.group(1)} ended or did not answer {limit}"
    if "Timed out" in text or "timed out" in text:
        return f"a rank did not answer {limit}"
    # The connection to another rank closed: its process ended (an error it met is printed above, if any).
    return "another rank stopped: its process ended (its error, if it met one, is printed above)"


def _repair_log(args: argparse.Namespace) -> None:
    """--repair-log: drop the damaged lines of the run's logs (rank 0, before the others read them)."""
    from corelens.runs.dist import current
    from corelens.runs.rundir import repair_logs

    dist = current()
    if dist.main:
        repair_logs(args.out)
    dist.barrier()


def _resolve_data(args: argparse.Namespace) -> None:
    """Replace NAME:PATH by its converted (cached) sample file; under torchrun rank 0 converts first."""
    from corelens.data.readers import resolve
    from corelens.runs.dist import current

    dist = current()
    if not dist.main:
        dist.barrier()  # the others read the cache rank 0 has written
    args.data = str(resolve(args.data))
    if dist.main:
        dist.barrier()


if __name__ == "__main__":
    sys.exit(main())
