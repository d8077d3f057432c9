"""The dataset card (README.md) of an exported head set: hub metadata, what the set is, how it was found."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corelens.heads.artifact import HeadSet

_SHOWN = 10  # heads listed in the card's table


def card(hs: HeadSet) -> str:
    """Return the README.md of an artifact folder (YAML front matter for the hub's dataset viewer)."""
    model, prov = hs.model, hs.provenance
    name = model.get("id") or "a local checkpoint"
    cols = [c for c in ("rank", "layer", "head", "mass", "share", "lift", "n") if c in hs.heads.columns]
    shown = hs.heads.head(_SHOWN if hs.keep is None else max(hs.keep, 1))[cols]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for rec in shown.itertuples(index=False):
        rows.append("| " + " | ".join(_cell(v) for v in rec) + " |")
    kv = hs.granularity == "kv"
    unit = "KV heads (each standing for all its query heads)" if kv else "heads"
    chosen = f"the top {hs.keep} {unit}" if hs.keep else "the whole ranking (choose k when you use it)"
    e = prov.get("effective")
    if e:
        # A KV-deciding tool keeps every KV head with a full query head: state what the set costs there.
        chosen += (
            f": {e['query_full']} query heads full, {e['kv_full']} of the KV heads full "
            f"({e['kv_fraction']:.1%} of the KV cache at a long prompt; DuoAttention --sparsity "
            f"{e['duo_sparsity']:.6f})"
        )
    lines = [
        "---",
        "tags: [corelens, attention-heads, retrieval-heads, multimodal]",
        "configs:",
        "- config_name: default",
        "  data_files: heads.csv",
        "---",
        f"# CoRe heads of {name}",
        "",
        f"A corelens head set (format `{hs.format}`): every decoder attention {'KV head' if kv else 'head'} of "
        f"{name} ranked by Retrieval Attention Mass. The published set is {chosen}.",
        "",
        "| model | value |",
        "|---|---|",
        f"| id | {model.get('id')} |",
        f"| revision / commit | {model.get('revision')} / {model.get('commit')} |",
        f"| model type | {model.get('model_type')} |",
        f"| model digest (config + weights metadata, no path) | {model.get('config_hash')} |",
        f"| layers x heads (KV heads) | {model.get('layers')} x {model.get('heads')} ({model.get('kv_heads')}) |",
        "",
        "## How the heads were found",
        "",
        f"`corelens rank` on `{prov.get('data')}` (sha256 `{prov.get('data_sha256')}`), "
        f"{prov.get('samples')} samples, query rows `{prov.get('query')}`, box rule `{prov.get('rule')}`, "
        f"padding `{prov.get('padding')}`, corelens {prov.get('corelens_version')}. The run's manifest is "
        "`manifest.json`.",
        "",
        "## Heads",
        "",
        *rows,
        "",
        "## Use",
        "",
        "```python",
        "import corelens",
        'hs = corelens.HeadSet.load("ORG/NAME")  # this dataset\'s id, or its folder',
        "hs.check(corelens.load(MODEL))  # fails unless MODEL is the model above",
        "```",
        "",
        "or `corelens ablate --heads ORG/NAME ...` / `corelens hybrid --heads ORG/NAME ...`.",
        "",
    ]
    return "\n".join(lines)


def _cell(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
