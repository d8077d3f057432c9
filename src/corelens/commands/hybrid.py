"""`corelens hybrid`: accuracy vs heads kept full under CoRe-guided hybrid attention (docs/methods.md#hybrid)."""

from __future__ import annotations

import argparse
import sys

from corelens.choices import DENSE_BELOW, HYBRID_SET_KINDS, KERNELS, SCORERS
from corelens.commands.argtypes import k_list, names_of, output_path, samples_path, token_size
from corelens.commands.common import (
    add_draw_options,
    add_granularity,
    add_limit_options,
    add_model_options,
    add_random_from,
    add_resample_options,
    add_run_options,
    limits_of,
    load_options,
    main_process,
    print_resampled,
)


def run(args: argparse.Namespace) -> None:
    """Run the hybrid accuracy curve into a run directory and print its table."""
    from corelens.experiments.hybrid import curve_path
    from corelens.heads import resolve_heads

    result = curve_path(
        args.model,
        args.data,
        resolve_heads(args.heads),
        args.out,
        keeps=args.keep,
        sets=[s.strip() for s in args.sets.split(",") if s.strip()],
        seeds=args.seeds,
        control_width=args.control_width,
        max_draws=args.max_draws,
        seed=args.seed,
        random_from=args.random_from,
        sink=args.sink,
        window=args.window,
        decode=args.decode,
        scorer=args.scorer,
        max_new_tokens=args.max_new_tokens,
        limit=args.limit,
        skip_bad=args.skip_bad,
        limits=limits_of(args),
        rank_resamples=args.rank_resamples,
        stable_p=args.stable_p,
        granularity=args.granularity,
        kernel=args.kernel,
        dense_below=args.dense_below,
        progress=True,
        argv=sys.argv,
        load_options=load_options(args),
    )
    if not main_process():
        return
    cols = ["set", "keep", "full_heads", "kv_full_heads", "seed", "accuracy", "n", "ci_low", "ci_high"]
    cols += ["cache_kept_fraction", "cache_saved_fraction"]
    print(result.table[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print_resampled(result, args.rank_resamples)
    dense = result.table[result.table["dense_prefills"] > 0]
    if len(dense):
        print(
            f"the partitioned kernel's crossover (--dense-below {args.dense_below}) ran every head dense in "
            f"{dense['dense_prefills'].mean():.0%} of the layer prefills of {len(dense)} condition(s) "
            "(hybrid.csv: dense_prefills; manifest.json: prefill)",
            file=sys.stderr,
        )
    print(
        f"S = {result.sink}, W = {result.window} tokens, decode {args.decode}; "
        f"median prompt {result.median_tokens:.0f} tokens"
    )
    print(f"wrote {args.out}/hybrid.csv, records.parquet, policies.json, figures/hybrid.png")


def register(sub) -> None:
    """Add the `hybrid` parser."""
    h = sub.add_parser("hybrid", help="accuracy vs heads kept full under hybrid (full + streaming) attention")
    add_model_options(h)
    h.add_argument(
        "--data", type=samples_path, required=True, help="samples to evaluate on (JSONL, with answers)"
    )
    h.add_argument(
        "--heads",
        required=True,
        help="heads.csv of a rank run, an exported head-set folder or its hub id (found on other data)",
    )
    h.add_argument("--out", type=output_path, required=True, help="run directory (resumed if it exists)")
    h.add_argument(
        "--keep", type=k_list, default="5%,10%,20%,50%", help="shares (or counts) of heads kept full"
    )
    h.add_argument(
        "--sets",
        type=names_of(HYBRID_SET_KINDS, "head set"),
        default="top,random,bottom",
        help="full sets: top (CoRe), random, bottom, layer-matched, stable (P(top-k) >= --stable-p), "
        "adaptive (the top set's count per layer, the heads chosen per prompt)",
    )
    add_resample_options(h, "keep full")
    h.add_argument(
        "--sink",
        type=token_size,
        default="128",
        help="sink tokens S: a count, or a share of the median prompt (5%%)",
    )
    h.add_argument(
        "--window",
        type=token_size,
        default="1024",
        help="window W: a count, or a share of the median prompt (25%%)",
    )
    h.add_argument(
        "--decode",
        choices=("full", "stream"),
        default="full",
        help="decoding after the hybrid prefill: full attention (the paper) or the streaming pattern",
    )
    add_granularity(h, "kept full")
    h.add_argument(
        "--kernel",
        choices=KERNELS,
        default="auto",
        help="prefill kernel of the streaming heads (auto: flex on CUDA, blocked on the CPU; docs/methods.md#hybrid)",
    )
    h.add_argument(
        "--dense-below",
        type=float,
        default=DENSE_BELOW,
        help="the partitioned kernel's crossover: a layer whose head set's ideal speed-up is below it runs every "
        "head dense, as stock attention (0: never; the default is not yet measured on a GPU)",
    )
    add_draw_options(h, "each random / layer-matched set")
    h.add_argument("--seed", type=int, default=0, help="base seed of the random draws")
    add_random_from(h)
    h.add_argument(
        "--scorer",
        choices=SCORERS,
        default="auto",
        help="how an answer is scored: exact match, a choice letter, yes/no; auto picks by the gold answer",
    )
    h.add_argument("--max-new-tokens", type=int, default=8, help="greedy answer length in tokens")
    h.add_argument("--limit", type=int, default=None, help="use the first N samples")
    h.add_argument("--skip-bad", action="store_true", help="log and skip bad samples instead of stopping")
    add_run_options(h)
    add_limit_options(h)
    h.set_defaults(func=run)
