"""`corelens bench WHAT ...`: performance benchmarks (each times both sides in one run).

The benchmarks are measured by corelens.bench.*; this module only parses their options and calls them: every
option of `corelens bench WHAT` is a keyword argument of `corelens.bench.<module>.run_WHAT_benchmark` (under
the names in RENAMED; `--no-X` is `with_X=False`), except --json (where the printed summary's result is written)
and those that the command handles itself (`hybrid --table`, `flow --threads`). So `corelens bench WHAT --help`
and a malformed value are answered like any other command's. From a source tree without the `corelens`
script, `python -m corelens bench WHAT ...` is the same command.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

from corelens.choices import KERNELS
from corelens.commands.argtypes import checked, device, existing_path, output_file, output_path, positive
from corelens.errors import InputError, OptionError

# The benchmark's module in corelens.bench.
MODULES = {"ram": "ram_probe", "flow": "flow_metrics", "hybrid": "hybrid_kernels", "scale": "scale",
           "decode": "decode"}  # fmt: skip
# Options whose keyword argument has another name.
RENAMED = {
    "hybrid": {
        "keep": "keeps",
        "prefill_keep": "prefill_keeps",
        "prefill_granularity": "prefill_granularities",
    },
    "scale": {"samples": "sizes"},
}
# Defaults of the whole-number options (the synthetic model's shape and the benchmark's sizes).
SIZES = {"layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 2, "head_dim": 128, "intermediate": 5632,
         "target_tokens": 1024, "query_rows": 32, "window": 1024}  # fmt: skip
DTYPES = ("float32", "bfloat16", "float16")
JSON_HELP = "write the results to this JSON file"


def _sizes_of(parser, *names: str, **defaults) -> None:
    """Add whole-number options `names` (`--kv-heads`), defaults from SIZES unless given in `defaults`."""
    for name in names:
        dest = name[2:].replace("-", "_")
        parser.add_argument(name, type=positive, default=defaults.get(dest, SIZES.get(dest)))


def _report(result: dict, line: str, path: str | Path | None) -> int:
    """Print a benchmark's summary `line` and write its `result` as JSON to `path`, if given; return 0."""
    if path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    print(line)
    return 0


def _run(args, handled: tuple[str, ...] = ()) -> int:
    """Call the benchmark `args.what` with its options; print its summary, write the JSON file if asked for."""
    bench = importlib.import_module(f"corelens.bench.{MODULES[args.what]}")
    renamed = RENAMED.get(args.what, {})
    kwargs = {}
    for dest in args.options:
        value = getattr(args, dest)
        if dest in ("json", *handled):  # not the benchmark's
            continue
        if dest.startswith("no_"):  # --no-flex: with_flex=False
            kwargs[f"with_{dest[3:]}"] = not value
        else:
            kwargs[renamed.get(dest, dest)] = value
    result = getattr(bench, f"run_{args.what}_benchmark")(**kwargs)
    return _report(result, bench.summary(result), args.json)


def _ram_arguments(parser) -> None:
    """Add the options of `corelens bench ram` to `parser`."""
    parser.add_argument("--tokens", type=positive, required=True, help="prompt length N")
    parser.add_argument("--json", type=output_file, help=JSON_HELP)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--no-eager", dest="eager", action="store_false", default=None, help="skip eager")
    group.add_argument(
        "--eager", dest="eager", action="store_true", help="run eager even past the memory limit"
    )
    _sizes_of(parser, "--layers", "--hidden", "--heads", "--kv-heads", "--intermediate", "--target-tokens",
              "--query-rows")  # fmt: skip
    parser.add_argument("--repeats", type=positive, default=None, help="default: 3 up to 8192 tokens, else 1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device", type=device, default="cpu", help="cpu, cuda, cuda:1 ... (GPU peak: allocator peak)"
    )
    parser.add_argument("--dtype", default="float32", choices=DTYPES)


def _flow_arguments(p) -> None:
    """Add the options of `corelens bench flow` to `p`."""
    p.add_argument("--tokens", type=positive, default=4096)
    p.add_argument("--hidden", type=positive, default=3584)
    p.add_argument("--repeats", type=positive, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=positive, default=None, help="threads of every BLAS pool (default: as loaded)"
    )
    p.add_argument(
        "--device", type=device, default="cpu", help="device of corelens' side: cpu, cuda, cuda:1 ..."
    )
    p.add_argument("--json", type=output_path, default=None, help="write the result here")


def _run_flow(args) -> int:
    """Run the benchmark with `--threads` threads in every BLAS pool (in a new process where they differ)."""
    import torch

    from corelens.bench.flow_metrics import _THREADS_ENV

    if args.threads and os.environ.get(_THREADS_ENV[0]) != str(args.threads):
        # OpenBLAS (numpy, scipy) fixes its thread count when loaded: run again with every pool set to N.
        env = {**os.environ, **{k: str(args.threads) for k in _THREADS_ENV}}
        options = [(f"--{d.replace('_', '-')}", str(getattr(args, d))) for d in args.options
                   if getattr(args, d) is not None]  # fmt: skip
        child = [sys.executable, "-m", "corelens", "bench", "flow", *(x for pair in options for x in pair)]
        raise SystemExit(subprocess.run(child, env=env).returncode)
    if args.threads:
        torch.set_num_threads(args.threads)
    return _run(args, handled=("threads",))


def _hybrid_arguments(parser) -> None:
    """Add the options of `corelens bench hybrid` to `parser`."""
    shares = checked(_fractions, "shares")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--tokens", type=positive, help="prompt length N")
    what.add_argument(
        "--table",
        type=existing_path,
        nargs="+",
        metavar="FILE",
        help="print the README table of saved results",
    )
    parser.add_argument("--keep", type=shares, default="0.2", help="kept (full) shares of heads: 0.05,10%%")
    parser.add_argument("--sink", type=int, default=128)
    _sizes_of(parser, "--window")
    parser.add_argument("--json", type=output_file, help=JSON_HELP)
    _sizes_of(parser, "--heads", "--kv-heads", "--hidden", "--intermediate")
    parser.add_argument("--layers", type=positive, default=2, help="decoder layers of the prefill model")
    parser.add_argument("--repeats", type=positive, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive, default=None, help="default: every core")
    parser.add_argument("--no-flex", action="store_true", help="skip compiled FlexAttention")
    parser.add_argument("--no-prefill", action="store_true", help="skip the whole-decoder prefill")
    parser.add_argument("--device", type=device, default="cpu", help="cpu, cuda, cuda:1 ...")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument(
        "--prefill-keep", type=shares, help="kept share(s) for the prefill (default: those of --keep)"
    )
    parser.add_argument(
        "--adaptive", action="store_true", help="also time the prefill with the full heads chosen per prompt"
    )
    parser.add_argument(
        "--kernel",
        default="auto",
        choices=KERNELS,  # corelens.choices: the registered kernels, read without importing torch
        help="the hybrid kernel timed as `hybrid`: auto, blocked, flex, partitioned or reference (default auto;"
        " compiled flex is timed beside it unless --no-flex)",
    )
    parser.add_argument(
        "--granularity",
        choices=("query", "kv"),
        default="query",
        help="draw the full heads as query heads or as whole KV heads (--keep: a share of KV heads)",
    )
    parser.add_argument(
        "--prefill-granularity",
        type=_granularities,
        default=None,
        metavar="G[,G]",
        help="time the prefill at each granularity: query, kv or query,kv (default: that of --granularity)",
    )


def _granularities(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    wrong = [name for name in names if name not in ("query", "kv")]
    if not names or wrong or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"expected query, kv or query,kv, got {text!r}")
    return names


def _fractions(text: str) -> list[float]:
    from corelens.bench.hybrid_kernels import fractions

    return fractions(text)


def _run_hybrid(args) -> int:
    """Run the benchmark with parsed options (or, with --table, print the table of saved results)."""
    from corelens.attention.kernels import KERNELS
    from corelens.bench.hybrid_kernels import prefill_table, table

    if args.table:
        results = []
        for path in args.table:
            try:
                results.append(json.loads(Path(path).read_text()))
            except (OSError, ValueError) as err:
                raise InputError(f"cannot read it: {err}", file=path) from None
            if (
                not isinstance(results[-1], dict)
                or not {"tokens", "sdpa_s", "per_keep"} <= results[-1].keys()
            ):
                raise InputError("not a result of `corelens bench hybrid --json`", file=path)
        print(table(results))
        by_granularity = prefill_table(results)  # results written before it lack the per-granularity rows
        if by_granularity:
            print("\n" + by_granularity)
        return 0
    if args.kernel not in KERNELS:  # before any work
        raise OptionError(f"--kernel: unknown hybrid kernel {args.kernel!r}; expected one of {KERNELS}")
    return _run(args, handled=("table",))


def _decode_arguments(parser) -> None:
    """Add the options of `corelens bench decode` to `parser`."""
    parser.add_argument("--tokens", type=positive, required=True, help="prompt length N")
    parser.add_argument("--steps", type=positive, default=64, help="decoded tokens (timed)")
    parser.add_argument(
        "--keep", type=checked(_fraction, "share"), default=0.2, help="full share F: 0.2 or 20%%"
    )
    parser.add_argument(
        "--granularity", choices=("kv", "query"), default="kv", help="F counts KV or query heads"
    )
    parser.add_argument("--sink", type=int, default=128)
    _sizes_of(parser, "--window", "--layers", "--hidden", "--heads", "--kv-heads", "--intermediate")
    parser.add_argument(
        "--kernel", choices=("auto", "blocked", "flex"), default="auto", help="hybrid prefill"
    )
    parser.add_argument("--repeats", type=positive, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=device, default="cpu", help="cpu, cuda, cuda:1 ...")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--json", type=output_file, help=JSON_HELP)


def _fraction(text: str) -> float:
    shares = _fractions(text)
    if len(shares) != 1:
        raise argparse.ArgumentTypeError(f"expected one share such as 0.2 or 20%, got {text!r}")
    return shares[0]


def _samples(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sample counts such as 32,256, got {text!r}") from None
    if min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sample counts must be at least 1, got {text!r}")
    return sizes


def _scale_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options of `corelens bench scale` to `p`."""
    p.add_argument("--samples", type=_samples, default=(32, 256), help="run sizes, e.g. 32,256 (default)")
    p.add_argument("--task", choices=("image", "video", "document"), default="document")
    p.add_argument("--repeats", type=positive, default=2)
    _sizes_of(p, "--layers", "--hidden", "--heads", "--kv-heads", "--head-dim", "--intermediate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-overhead", action="store_true", help="skip the per-sample overhead measurement")
    p.add_argument("--json", type=output_file, help=JSON_HELP)


BENCHMARKS = {
    "ram": ("RAM probe against stock sdpa and eager attention: time and peak memory", _ram_arguments, _run),
    "flow": ("RID + MixIG of one module against a direct SVD + dense implementation", _flow_arguments, _run_flow),
    "hybrid": ("hybrid attention kernels and prefill against stock sdpa and FlexAttention", _hybrid_arguments,
               _run_hybrid),
    "scale": ("corelens rank on 1 and 2 processes, and its per-sample overhead", _scale_arguments, _run),
    "decode": ("decoding tokens/s and KV-cache bytes: stock dense cache against hybrid's trimmed cache",
               _decode_arguments, _run),
}  # fmt: skip


# The help of the synthetic model's shape and the run's options that the benchmarks share.
SHARED_HELP = {
    "layers": "decoder layers of the synthetic model",
    "hidden": "hidden size of the synthetic model",
    "heads": "query heads per layer",
    "kv_heads": "KV heads per layer",
    "head_dim": "channels per head",
    "intermediate": "FFN intermediate size",
    "target_tokens": "tokens of the target region Ω",
    "query_rows": "query rows measured",
    "tokens": "prompt length N",
    "sink": "sink tokens S every streaming head keeps",
    "window": "recent tokens W every streaming head keeps",
    "repeats": "timed repeats (the median is reported)",
    "seed": "seed of the random weights and inputs",
    "dtype": "dtype of weights and activations",
    "task": "the organism task whose samples are ranked",
}


def register(sub) -> None:
    """Add the `bench` parser and one sub-parser per benchmark."""
    b = sub.add_parser("bench", help="performance benchmarks (see benchmarks/)")
    what = b.add_subparsers(dest="what", required=True, metavar="WHAT")
    for name, (summary, arguments, run) in BENCHMARKS.items():
        w = what.add_parser(name, help=summary, description=summary)
        arguments(w)
        options = []
        for action in w._actions:
            action.help = action.help or SHARED_HELP.get(action.dest)
            if action.dest != "help" and action.dest not in options:
                options.append(action.dest)
        w.set_defaults(func=run, options=tuple(options))
