"""A head set as a portable artifact: `headset.json` + `heads.csv` + a dataset card, in one folder.

`corelens export RUN --out DIR` writes the folder from a rank run; `huggingface_hub.upload_folder` publishes it
as a dataset as it is, and `HeadSet.load(path_or_hub_id)` reads it back (a hub id from the hub cache first, as
`--model` does; `HF_HUB_OFFLINE=1` never downloads). The format (`FORMAT`, documented in docs/headsets.md):

- `model`: id, revision, commit, model type, `config_hash` (the digest of the model's identity: its config's
  content and its weights' metadata, never its path; `corelens.runs.identity`), layers, query heads and KV
  heads per layer, and `identity` (the digest with the summary a refusal names differences from);
- `heads`: every (layer, head) with its rank and scores (mass, share, lift, n and any other heads.csv column);
- `keep`: the size of the published set (the top `keep` heads), or null when the whole ranking is the product;
- `provenance`: data file name and sha256, query rows, box rule, padding, the head score and its settings
  (`score`: `{"name": "ram"}` unless `rank --score` chose another), samples, corelens version and the rank
  run's manifest.

The folder also holds the rank run's `manifest.json` beside `heads.csv`, so every command that takes a
heads.csv (`--heads`) reads an exported folder the same way, same-data warning included.
"""

from __future__ import annotations

import hashlib
import json
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from corelens.data import jsonfile
from corelens.errors import CorelensError, warn
from corelens.heads.card import card
from corelens.heads.spec import FORMAT, count
from corelens.metrics import kvheads
from corelens.runs import files, identity

FILE = "headset.json"
TABLE = "heads.csv"
MANIFEST = "manifest.json"
CARD = "README.md"
_DTYPE_KEYS = {"dtype", "torch_dtype"}


def _plain(value: Any) -> Any:
    """Return a numpy scalar as the Python value it holds (so that a message shows 0.5, not np.float64(0.5))."""
    return value.item() if isinstance(value, np.generic) else value


def _integers(column: pd.Series, name: str, entry: Callable[[int], str]) -> np.ndarray:
    """Return a layer or head column as int64; raise naming the first entry that is not an integer."""
    if pd.api.types.is_bool_dtype(column) or not pd.api.types.is_numeric_dtype(column):
        # Bools, or text (a CSV column holding "x" reads as text throughout): name the first value not a number.
        numeric = pd.to_numeric(
            column.where(~column.map(lambda v: isinstance(v, bool)), None), errors="coerce"
        )
        bad = int(np.argmax(numeric.isna().to_numpy())) if numeric.isna().any() else 0
        raise CorelensError(f"{entry(bad)}: {name} {_plain(column.iloc[bad])!r} is not an integer")
    values = column.to_numpy(dtype=float)
    wrong = ~np.isfinite(values) | (values != np.round(values))  # NaN, infinities, 0.5
    if wrong.any():
        bad = int(np.argmax(wrong))
        raise CorelensError(f"{entry(bad)}: {name} {_plain(column.iloc[bad])!r} is not an integer")
    return values.astype(np.int64)


def check_table(
    table: pd.DataFrame, layers: int, heads: int, entry: Callable[[int], str] = lambda i: f"heads[{i}]"
) -> pd.DataFrame:
    """Return `table` with integer `layer` and `head` after checking it against a model of `layers` x `heads`.

    Refused, naming the entry (`entry(i)` of row i): a layer or head that is not an integer (0.5, NaN, a bool, a
    string) or is outside the model, a (layer, head) listed twice, a rank that is not a finite number, and a
    table that does not hold every head once. Only the table is read: nothing is allocated per head of the
    model, so a shape claimed by a file costs nothing until it matches the table.
    """
    missing = {"layer", "head", "rank"} - set(table.columns)
    if missing:
        raise CorelensError(f"a head set needs the columns layer, head, rank; missing {sorted(missing)}")
    found = {
        "layer": _integers(table["layer"], "layer", entry),
        "head": _integers(table["head"], "head", entry),
    }
    for name, top in (("layer", layers), ("head", heads)):
        outside = (found[name] < 0) | (found[name] >= top)
        if outside.any():
            bad = int(np.argmax(outside))
            raise CorelensError(f"{entry(bad)}: {name} {found[name][bad]} is outside 0..{top - 1}")
    twice = pd.Series(list(zip(found["layer"], found["head"]))).duplicated().to_numpy()
    if twice.any():
        bad = int(np.argmax(twice))
        raise CorelensError(f"{entry(bad)}: L{found['layer'][bad]}H{found['head'][bad]} is listed twice")
    rank = table["rank"]
    finite = pd.api.types.is_numeric_dtype(rank) and not pd.api.types.is_bool_dtype(rank)
    bad_rank = ~np.isfinite(rank.to_numpy(dtype=float)) if finite else np.ones(len(rank), dtype=bool)
    if bad_rank.any():
        bad = int(np.argmax(bad_rank))
        raise CorelensError(f"{entry(bad)}: rank {_plain(rank.iloc[bad])!r} is not a finite number")
    if len(table) != layers * heads:
        raise CorelensError(
            f"a head set of {len(table)} heads does not cover {layers} layers x {heads} heads"
        )
    return table.assign(layer=found["layer"], head=found["head"])


def config_hash(config: Any) -> str:
    """Return the hash head sets recorded before `identity` (sha256 of the config without its dtype fields,
    `_name_or_path` included): kept to recognise an old head set on the folder it was made from."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): strip(v) for k, v in value.items() if k not in _DTYPE_KEYS}
        return value

    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    text = json.dumps(strip(data), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_info(of: Any, source: dict | None = None, *, revision: str | None = None) -> dict[str, Any]:
    """Return what a head set records about its model: hub id, revision and commit, model type, identity
    digest, head counts and the identity itself.

    `of` is an identity (`Loaded.identity()`), a `Loaded` model, or a transformers config with the hub
    `source` (id, commit) of its checkpoint: a config alone is identified by its content only (no weights).
    """
    if hasattr(of, "identity"):
        ident = of.identity()
    elif isinstance(of, dict) and "digest" in of:
        ident = of
    else:
        ident = identity.record(of, {}, source, kind="config")
    return {
        "id": ident.get("id"),
        "revision": revision,
        "commit": ident.get("commit"),
        "model_type": ident.get("family"),
        "config_hash": ident["digest"],
        "layers": count(ident.get("layers"), "model.layers"),
        "heads": count(ident.get("heads"), "model.heads"),
        "kv_heads": count(ident.get("kv_heads"), "model.kv_heads"),
        "identity": ident,
    }


def describe(model: dict[str, Any]) -> str:
    """Return a one-line description of a model record, e.g. "org/x (qwen2_5_vl, 4 x 8 heads, 2 KV, model ab12)"."""
    return identity.describe({**model, "family": model.get("model_type"), "digest": model.get("config_hash")})


def checkpoint_identity(spec: str | Path) -> dict[str, Any]:
    """Return the identity of a checkpoint folder or hub id without loading its weights (headers only)."""
    from corelens.models.hub import resolve
    from corelens.models.loaded import read_config

    found = resolve(spec)
    weights = identity.weights_of_folder(found.path)
    return identity.record(read_config(found.path), weights, found.to_dict())


@dataclass
class HeadSet:
    """A ranked head set for one checkpoint: the model it belongs to, the ranked heads, and how they were found.

    Examples:
        >>> import corelens as cl
        >>> from corelens.organism import organism_path
        >>> from corelens.organism.tasks import generate
        >>> m, tmp = cl.load(organism_path(), device="cpu"), getfixture("tmp_path")
        >>> _ = cl.rank(m, generate("image", tmp, 8, seed=1), query="answer", out=tmp / "run")
        >>> hs = cl.HeadSet.from_run(tmp / "run", keep=4)
        >>> hs.top(), hs.model["layers"], hs.model["heads"], hs.provenance["samples"]
        ([(0, 7), (0, 5), (0, 6), (1, 0)], 4, 8, 8)
        >>> sorted(p.name for p in hs.save(tmp / "headset").iterdir())
        ['README.md', 'heads.csv', 'headset.json', 'manifest.json']
        >>> cl.HeadSet.load(tmp / "headset").top(2)
        [(0, 7), (0, 5)]
        >>> hs.check(m)  # raises unless `m` is the model the set was found on; else the notes of what differs
        []
    """

    format: ClassVar[str] = FORMAT  # what headset.json's "format" says (the card quotes it)
    model: dict[str, Any]
    heads: pd.DataFrame  # one row per (layer, head): rank (1 = best) and scores
    keep: int | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.model, dict):
            raise CorelensError(f"model must be an object, got {type(self.model).__name__}")
        # The shape is checked first, and against the table's length before anything is made per head.
        layers = count(self.model.get("layers"), "model.layers")
        heads = count(self.model.get("heads"), "model.heads")
        if self.model.get("kv_heads") is not None:
            count(self.model["kv_heads"], "model.kv_heads")
        # A KV-granular table (`rank --granularity kv`) holds one row per KV head.
        unit = "KV heads" if self.granularity == "kv" else "heads"
        per_layer = count(self.model.get("kv_heads"), "model.kv_heads") if unit == "KV heads" else heads
        total = layers * per_layer
        if len(self.heads) != total:
            raise CorelensError(
                f"a head set of {len(self.heads)} {unit} does not cover {layers} layers x {per_layer} {unit}"
            )
        keep = self.keep
        if keep is not None and (
            isinstance(keep, bool) or not isinstance(keep, numbers.Integral) or not 0 <= keep <= total
        ):
            raise CorelensError(f"keep must be an integer in 0..{total} or null, got {keep!r}")
        self.heads = check_table(self.heads, layers, per_layer).sort_values("rank").reset_index(drop=True)

    @property
    def granularity(self) -> str:
        """Return "kv" when the ranked rows are KV heads (`corelens rank --granularity kv`), else "query"."""
        return kvheads.granularity_of(self.heads)

    @property
    def group(self) -> int:
        """Return the query heads per KV head of the model (1 without GQA)."""
        return kvheads.group_size(self.model["heads"], self.model.get("kv_heads"))

    def query_top(self, k: int | None = None) -> list[tuple[int, int]]:
        """Return the query heads of the top `k` rows: the rows themselves, or all members of the KV heads."""
        top = self.top(k)
        return list(kvheads.expand(top, self.group)) if self.granularity == "kv" else sorted(top)

    def effective(self, k: int | None = None, *, sink: int = 128, window: int = 1024) -> dict[str, Any]:
        """Return the asked and the effective shares of the top `k` rows (None: `keep`), and the sparsity
        (DuoAttention `--sparsity`, kvpress `head_compression_ratio`) that reproduces its KV heads.

        Effective: query heads full, KV heads full (any member full) and KV-cache bytes kept at a long
        prompt (`corelens.metrics.kvheads.shares`).
        """
        top, model = self.top(k), self.model
        got = kvheads.shares(self.query_top(k), model["layers"], model["heads"], model.get("kv_heads"))
        sparsity = kvheads.duo_sparsity(got["kv_full"], model["layers"] * model["heads"] // self.group)
        return {
            "granularity": self.granularity,
            "asked": len(top),
            "asked_fraction": len(top) / len(self.heads),
            **got,
            "cache_kept_note": f"long-prompt limit: a streaming KV head keeps {sink} + {window} tokens",
            "duo_sparsity": sparsity,
            "kvpress_head_compression_ratio": sparsity,
        }

    def top(self, k: int | None = None) -> list[tuple[int, int]]:
        """Return the top `k` (layer, head) pairs, best first; `k=None` is the published set (`keep`)."""
        k = self.keep if k is None else k
        if k is None:
            raise CorelensError("this head set publishes a ranking, not a set: give k")
        best = self.heads.head(int(k))
        return list(zip(best["layer"].astype(int), best["head"].astype(int)))

    def check(self, m: Any, strict: bool | None = None) -> list[str]:
        """Raise unless `m` (a `Loaded` model, or a checkpoint folder or hub id, read without its weights) is the
        model this head set was found on, wherever its files are; the message names both and what differs.
        Return the notes of what differs without changing what the heads mean (also warned, and kept in
        `m.identity_notes`, which the run's manifest records).

        Compared: the identity (`corelens.runs.identity.judge`) when the set records one: the architecture,
        rope, layer / head counts, the tensors' names and shapes and the weights' content refuse; a re-save in
        another dtype or an initialisation / generation setting is a note. `strict=False` (`--allow-other-model`; by default
        `m.strict_identity`, else True) turns a refusal into a warning and a note. An imported set (DuoAttention,
        SparseMM) is compared on the shape it records; a set written before identities on its shape, its old
        config hash checked only where it can be (same folder), else accepted with a note.
        """
        strict = getattr(m, "strict_identity", True) if strict is None else strict
        where = m.path if hasattr(m, "identity") else m
        ident = m.identity() if hasattr(m, "identity") else checkpoint_identity(m)
        ours, theirs = self.model, model_info(ident)
        mismatch = [f for f in ("layers", "heads", "kv_heads") if ours.get(f) not in (None, theirs[f])]
        recorded = ours.get("identity")
        notes: list[str] = []
        if isinstance(recorded, dict):
            serious, benign = identity.judge(recorded, ident)
            if serious and strict:
                raise CorelensError(
                    f"this head set belongs to {identity.explain(recorded, ident)} (the model loaded from "
                    f"{where}); --allow-other-model (strict=False) uses it anyway"
                )
            if serious:
                notes.append(f"head set of another model used (--allow-other-model): {'; '.join(serious)}")
            if benign:
                notes.append(f"head set of a model that differs only in {'; '.join(benign)}: its heads hold")
            for note in notes:
                warn(note)
            if hasattr(m, "identity_notes"):
                m.identity_notes.extend(n for n in notes if n not in m.identity_notes)
            if not serious:
                mismatch = []
        if mismatch and not strict:
            mismatch = []  # the caller takes the set as it is; the heads are checked against the model later
        if mismatch:
            what = "; ".join(f"{f} {ours[f]} -> {theirs[f]}" for f in mismatch)
            raise CorelensError(
                f"this head set belongs to {describe(ours)}, not to the model loaded from {where}: "
                f"{describe(theirs)}; what differs: {what}"
            )
        legacy = recorded is None and ours.get("config_hash") and hasattr(m, "model")
        if legacy and ours["config_hash"] != config_hash(m.model.config):
            # Its hash held the path: a set made elsewhere cannot be told apart, so the shape decides.
            warn(
                f"this head set was written by an earlier corelens (config hash {ours['config_hash']}, "
                "which held the model's path): checked on its layers and heads only; export it again "
                "to record the model's path-free identity"
            )
        return notes

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON document of `headset.json`."""
        records = json.loads(self.heads.to_json(orient="records"))
        return {
            "format": FORMAT,
            "model": self.model,
            "keep": self.keep,
            "heads": records,
            "provenance": self.provenance,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "headset.json") -> HeadSet:
        """Return the head set of a `headset.json` document; errors name `where` and the field or entry."""
        if not isinstance(data, dict):
            raise CorelensError(f"{where}: a head set is a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise CorelensError(
                f"{where}: not a corelens head set (format {data.get('format')!r}, expected {FORMAT!r})"
            )
        from corelens.attention.schema import validate
        from corelens.heads.schema import HeadSetFile

        # Every field's type and presence (docs/schemas/headset.schema.json), one line naming the field.
        validate(HeadSetFile, data, where)
        provenance = data.get("provenance") or {}
        try:
            return cls(data["model"], pd.DataFrame(data["heads"]), data.get("keep"), provenance)
        except CorelensError as err:
            raise CorelensError(f"{where}: {err}") from None

    def save(self, out: str | Path, manifest: dict | None = None) -> Path:
        """Write the artifact folder (headset.json, heads.csv, manifest.json, README.md card); return it."""
        out = files.folder(out)  # every file replaced, never written through a link (one line naming it)
        files.write_text(out / FILE, json.dumps(self.to_dict(), indent=2) + "\n", root=out)
        with files.writer(out / TABLE, root=out, mode="w") as f:
            self.heads.to_csv(f, index=False)
        manifest = manifest if manifest is not None else self.provenance.get("manifest")
        if manifest:
            text = json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
            files.write_text(out / MANIFEST, text, root=out)
        files.write_text(out / CARD, card(self), root=out)
        return out

    @classmethod
    def load(cls, spec: str | Path, revision: str | None = None) -> HeadSet:
        """Read a head set: an artifact folder, its headset.json, or a hub dataset id ORG/NAME[@REVISION]."""
        path = Path(spec).expanduser()
        if path.is_file() and path.name == FILE:
            path = path.parent
        folder = artifact_folder(path if path.is_dir() else str(spec), revision)
        data = jsonfile.load(folder / FILE, root=folder)  # one line: repeated key, too big or too deep
        return cls.from_dict(data, str(folder / FILE))

    @classmethod
    def from_run(
        cls, run: str | Path, *, keep: int | None = None, model: str | Path | None = None
    ) -> HeadSet:
        """Return the head set of a `corelens rank` run directory (its heads.csv and manifest.json)."""
        from corelens.runs.rundir import read_manifest

        run = files.refuse_links_out(Path(run))  # nothing read through a link leading out of the run
        table_path, manifest_path = run / TABLE, run / MANIFEST
        if not table_path.is_file() or not manifest_path.is_file():
            raise CorelensError(f"{run}: not a rank run (needs {TABLE} and {MANIFEST})")
        manifest = read_manifest(manifest_path)
        if manifest.get("command") != "rank":
            raise CorelensError(f"{run}: a {manifest.get('command')!r} run, not a rank run")
        settings = manifest.get("settings", {})
        ident = settings.get("model_identity")
        if model is not None or not isinstance(ident, dict):
            # A run of an earlier corelens records no identity: computed from its checkpoint's files.
            ident = _identity(model or settings.get("model"), settings)
        data = settings.get("data") or ""
        provenance = {
            "data": Path(data).name,
            "data_sha256": settings.get("data_sha256"),
            "query": settings.get("query"),
            "rule": settings.get("rule"),
            "padding": settings.get("padding"),
            # The head score ranked (`rank --score`): a run before scorers, or RAM's, records none.
            "score": settings.get("score") or {"name": "ram"},
            "samples": manifest.get("samples"),
            "corelens_version": manifest.get("versions", {}).get("corelens"),
            "manifest": manifest,
        }
        info = model_info(ident, revision=_revision(manifest.get("argv") or []))
        try:
            table = read_table(table_path)
            # A KV-granular run (`rank --granularity kv`) lists one row per KV head.
            per_layer = info["kv_heads"] if kvheads.granularity_of(table) == "kv" else info["heads"]
            table = check_table(table, info["layers"], per_layer, csv_line)
            return cls(info, table, keep, provenance)
        except CorelensError as err:
            raise CorelensError(f"{table_path}: {err}") from None


def csv_line(i: int) -> str:
    """Name row `i` of a heads.csv by its line in the file (line 1 is the header)."""
    return f"line {i + 2}"


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a heads.csv; a file that is not CSV is one line naming it."""
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise CorelensError(f"{path}: not a heads.csv table ({str(err).strip().splitlines()[0]})") from None


def _identity(model: str | Path | None, settings: dict) -> dict[str, Any]:
    """Return the identity of a run's checkpoint: its folder, else its hub id from the cache."""
    tries = [model] if model else []
    if settings.get("model_id"):
        tries.append(
            f"{settings['model_id']}@{settings['model_commit']}"
            if settings.get("model_commit")
            else settings["model_id"]
        )
    for spec in tries:
        try:
            return checkpoint_identity(spec)
        except CorelensError:
            continue
    raise CorelensError(
        f"cannot find the run's checkpoint config (tried {', '.join(map(str, tries)) or 'nothing'}); "
        "give its folder with --model"
    )


def _revision(argv: list[str]) -> str | None:
    """Return the --revision or ORG/NAME@REVISION a rank run was started with (None when none was given)."""
    for i, arg in enumerate(argv):
        if arg == "--revision" and i + 1 < len(argv):
            return argv[i + 1]
        if arg == "--model" and i + 1 < len(argv) and "@" in argv[i + 1]:
            return argv[i + 1].partition("@")[2]
    return None


def artifact_folder(spec: str | Path, revision: str | None = None) -> Path:
    """Return the local folder of a head-set artifact: a folder as it is, or a hub dataset id from the cache."""
    from corelens.models.hub import resolve

    return resolve(spec, revision, repo_type="dataset", needs=FILE, patterns=["*.json", "*.csv", "*.md"]).path


def resolve_heads(spec: str | Path) -> Path:
    """Return the heads.csv that `--heads` names: a heads.csv, an artifact folder or headset.json, or a hub id."""
    path = Path(spec).expanduser()
    if path.is_file() or path.suffix in (".csv", ".json"):
        # A file (read_heads names a missing one); an exported headset.json reads as its folder's heads.csv.
        table = path.parent / TABLE if path.name == FILE else path
    elif path.is_dir() and not (path / FILE).is_file() and (path / TABLE).is_file():
        table = path / TABLE  # a rank run directory
    else:
        table = artifact_folder(path if path.is_dir() else str(spec)) / TABLE
    if (table.parent / FILE).is_file():
        HeadSet.load(table.parent)  # a malformed headset.json is refused here, before any model loads
    return table


def check_heads(table_path: str | Path, m: Any) -> list[str]:
    """Raise when the heads.csv at `table_path` is part of an artifact made on another model (`HeadSet.check`);
    return the notes of what differs without changing what the heads mean."""
    folder = Path(table_path).parent
    if (folder / FILE).is_file():
        return HeadSet.load(folder).check(m)
    return []
