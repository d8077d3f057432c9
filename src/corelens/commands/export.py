"""`corelens export`: a rank run -> a publishable head-set folder (and DuoAttention / SparseMM files)."""

from __future__ import annotations

import argparse

from corelens.commands.argtypes import existing_path, k_one, names_of, output_path

TARGETS = ("duo", "sparsemm")


def run(args: argparse.Namespace) -> None:
    """Write the head-set artifact of a rank run, plus the foreign formats asked for."""
    from corelens.errors import CorelensError
    from corelens.heads import HeadSet
    from corelens.heads.formats import SPARSEMM_SCORES, write_duo, write_sparsemm, write_sparsemm_loader
    from corelens.metrics.headsets import k_count

    targets = [t.strip() for t in (args.to or "").split(",") if t.strip()]
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise CorelensError(f"--to: unknown format(s) {unknown}; expected some of {', '.join(TARGETS)}")
    hs = HeadSet.from_run(args.run, model=args.model)
    if args.keep is not None:
        hs.keep = k_count(args.keep, len(hs.heads))
    elif targets:
        raise CorelensError(f"--to {','.join(targets)} writes a set: give its size with --n-heads (e.g. 10%)")
    effective = hs.effective(sink=args.sink, window=args.window) if hs.keep else None
    if effective:
        hs.provenance["effective"] = effective  # headset.json states the asked and the effective shares
    out = hs.save(args.out)
    from corelens.heads.artifact import FILE, MANIFEST, TABLE

    wrote = [FILE, TABLE, MANIFEST, "README.md"]
    if "duo" in targets:
        write_duo(hs, out / "duo_attention", sink=args.sink, window=args.window, root=out)
        wrote.append("duo_attention/")
    if "sparsemm" in targets:
        paths = write_sparsemm(hs, out, root=out)
        wrote += [p.name for p in paths]
        loader = write_sparsemm_loader(hs, out, root=out)
        if loader is None:
            print(f"SparseMM's loader has no head-score file for model type {hs.model.get('model_type')!r}: "
                  f"give it {SPARSEMM_SCORES} by hand")  # fmt: skip
        else:
            wrote.append(loader.relative_to(out).as_posix())
            print(f"SparseMM reads {loader.relative_to(out)} from the folder it runs in: "
                  f"cp -r {out}/visual_head SPARSEMM_CHECKOUT/")  # fmt: skip
    unit = "KV heads" if hs.granularity == "kv" else "heads"
    kept = f"top {hs.keep} of {len(hs.heads)} {unit}" if hs.keep else f"all {len(hs.heads)} {unit} ranked"
    print(f"head set of {hs.model.get('id') or hs.model['model_type']}: {kept}")
    if effective:
        print(effective_line(effective))
    print(f"wrote {args.out}/" + ", ".join(wrote))


def effective_line(e: dict) -> str:
    """Return the one-line summary of `HeadSet.effective`: asked and effective shares, and the sparsity."""
    unit = "KV heads" if e["granularity"] == "kv" else "query heads"
    return (
        f"asked {e['asked']} {unit} ({e['asked_fraction']:.1%}); effective: {e['query_full']} query heads "
        f"full ({e['query_fraction']:.1%}) in corelens, {e['kv_full']} KV heads full ({e['kv_fraction']:.1%}, "
        f"their {e['query_full_by_kv']} query heads full in DuoAttention / kvpress), KV-cache bytes kept "
        f"{e['cache_kept_fraction']:.1%} at a long prompt; DuoAttention --sparsity {e['duo_sparsity']:.6f} "
        "(kvpress head_compression_ratio) reproduces these KV heads"
    )


def register(sub) -> None:
    """Add the `export` parser."""
    e = sub.add_parser("export", help="write a rank run's heads as a publishable head-set folder")
    e.add_argument("run", type=existing_path, help="a `corelens rank` run directory")
    e.add_argument(
        "--out",
        type=output_path,
        required=True,
        help="folder to write (huggingface_hub.upload_folder publishes it)",
    )
    e.add_argument(
        "--n-heads",
        "--keep",
        dest="keep",
        metavar="K",
        type=k_one,
        default=None,
        help="the published set: top K heads, a count or a share (10%%); KV heads for a KV-granular run",
    )
    e.add_argument(
        "--to",
        type=names_of(TARGETS, "format"),
        default=None,
        help=f"also write these formats (needs --n-heads): {', '.join(TARGETS)}",
    )
    e.add_argument("--sink", type=int, default=128, help="duo: sink tokens S of streaming heads")
    e.add_argument("--window", type=int, default=1024, help="duo: recent window W of streaming heads")
    e.add_argument(
        "--model", type=existing_path, default=None, help="the checkpoint folder, when the run's is gone"
    )
    e.set_defaults(func=run)
