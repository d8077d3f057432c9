"""What a model is, wherever its files are: the identity head sets, run manifests and resume checks record.

The identity never holds a path. It is a digest of

- the configuration's content: the transformers config as a dict (`config.to_dict()`, so a config written by
  another transformers version or kept in memory reads the same), without the fields that say where or how it
  was loaded (`_name_or_path`, `transformers_version`, every `_`-prefixed field) and without its dtype fields
  (the stored dtypes are in the weights' metadata; a bf16 load of fp32 files is the same model);
- the weights' metadata: every tensor's name, dtype and shape read from the safetensors headers (nothing is
  loaded), or, for weight files without such a header (`.bin`, `.pt`, ...), each file's size and sha256; a
  model in memory with no folder (kind "object") is described by its state dict; an identity made from a config
  alone (kind "config", no weights known) is compared on the config's digest only.

A hub checkpoint also records its repository id and commit: two loads of one `ORG/NAME` at one commit are the
same model whatever cache holds it, and a local copy of it is the same model when its digest agrees.

Beside the digest, the record keeps a small summary (family, layers, heads, KV heads, each config field's value
or, for a long one, a digest of it, and each tensor's dtype and shape) so that a refusal names what differs.

Examples:
    >>> a = {"digest": "1", "family": "qwen2_5_vl", "layers": 4, "config": {"text_config.num_key_value_heads": 2}}
    >>> b = {**a, "digest": "2", "config": {"text_config.num_key_value_heads": 4}}
    >>> same(a, b), differences(a, b)
    (False, ['config field text_config.num_key_value_heads: 2 -> 4'])
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from corelens.errors import CorelensError

# Config fields that say where or by what the checkpoint was written, not what it is (and every "_" field).
VOLATILE = {"transformers_version", "dtype", "torch_dtype"}
# Weight files without a safetensors header: identified by their size and sha256.
OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
SHORT = 64  # a config value longer than this (as JSON) is summarised by a digest
NAMED = 6  # a refusal names at most this many differences per kind, then counts the rest


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def clean_config(data: Any) -> Any:
    """Return a config dict without its volatile fields (location, writer, dtype), at every depth."""
    if isinstance(data, dict):
        return {
            str(k): clean_config(v)
            for k, v in data.items()
            if not str(k).startswith("_") and k not in VOLATILE
        }
    if isinstance(data, (list, tuple)):
        return [clean_config(v) for v in data]
    return data


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """Return {dotted field: value} of a cleaned config; a value longer than SHORT as JSON becomes its digest."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
            continue
        text = json.dumps(value, sort_keys=True, default=str)
        out[name] = value if len(text) <= SHORT else f"sha256:{_digest(value)}"
    return out


def safetensors_tensors(path: Path) -> dict[str, str]:
    """Return {tensor name: "DTYPE[shape]"} from a safetensors file's header (no tensor is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {
                name: f"{f.get_slice(name).get_dtype()}{list(f.get_slice(name).get_shape())}"
                for name in f.keys()  # noqa: SIM118 - safe_open has keys(), no iteration
            }
    except (SafetensorError, OSError) as err:
        raise CorelensError(f"{path}: cannot read its safetensors header ({err})") from None


def file_digest(path: Path) -> str:
    """Return "size sha256" of a weight file without a header (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return f"{path.stat().st_size} {digest.hexdigest()}"


def weights_of_folder(folder: Path) -> dict[str, Any]:
    """Return the weights' metadata of a checkpoint folder: tensors from safetensors headers, else file hashes."""
    shards = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    if shards:
        # Sharded or not, a tensor's name, dtype and shape are what the model is; the shard it sits in is not.
        tensors: dict[str, str] = {}
        for shard in shards:
            tensors.update(safetensors_tensors(shard))
        return {"tensors": dict(sorted(tensors.items()))}
    others = sorted(p for p in folder.iterdir() if p.suffix in OTHER_WEIGHTS and p.is_file())
    return {"files": {p.name: file_digest(p) for p in others}}


def weights_of_state(state: dict) -> dict[str, Any]:
    """Return the weights' metadata of a model kept in memory (no folder): its state dict's names, dtypes, shapes."""
    return {
        "tensors": {
            name: f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for name, t in sorted(state.items())
        }
    }


def record(
    config: Any, weights: dict[str, Any], source: dict | None = None, kind: str = "folder"
) -> dict[str, Any]:
    """Return the identity of a model: digest, hub id and commit, shape summary, config fields and weights.

    `config` is a transformers config (or its dict); `weights` comes from `weights_of_folder` or
    `weights_of_state`; `source` holds the hub id and commit of a hub checkpoint.
    """
    source = source or {}
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    clean = clean_config(data)
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    heads = getattr(text, "num_attention_heads", None)
    return {
        "digest": _digest({"config": clean, "weights": weights}),
        "config_digest": _digest(clean),
        "id": source.get("id"),
        "commit": source.get("commit"),
        "kind": kind,
        "family": data.get("model_type"),
        "layers": getattr(text, "num_hidden_layers", None),
        "heads": heads,
        "kv_heads": getattr(text, "num_key_value_heads", None) or heads,
        "config": flatten(clean),
        **weights,
    }


def same(a: dict, b: dict) -> bool:
    """Return True when two identities are one model: the same digest, or one hub repository at one commit;
    an identity made from a config alone (kind "config": no weights known) agrees on the config's digest."""
    if a.get("digest") == b.get("digest"):
        return True
    if "config" in (a.get("kind"), b.get("kind")) and a.get("config_digest") is not None:
        return a.get("config_digest") == b.get("config_digest")
    return bool(a.get("id") and a.get("commit")) and (a.get("id"), a.get("commit")) == (
        b.get("id"),
        b.get("commit"),
    )


def describe(ident: dict) -> str:
    """Return a one-line name of an identity: "org/x@0123456789ab (qwen2_5_vl, 4 layers x 8 heads, ...)"."""
    name = ident.get("id") or "a local checkpoint"
    if ident.get("commit"):
        name += f"@{ident['commit'][:12]}"
    return (
        f"{name} ({ident.get('family')}, {ident.get('layers')} layers x {ident.get('heads')} heads, "
        f"{ident.get('kv_heads')} KV heads, model digest {ident.get('digest')})"
    )


def _changes(kind: str, a: dict, b: dict) -> list[str]:
    """Return "KIND NAME: A -> B" for each key whose value differs (absent keys shown as "absent")."""
    names = sorted(k for k in set(a) | set(b) if a.get(k, ...) != b.get(k, ...))
    shown = [f"{kind} {k}: {_show(a, k)} -> {_show(b, k)}" for k in names[:NAMED]]
    return shown + ([f"and {len(names) - NAMED} more {kind}s"] if len(names) > NAMED else [])


def _show(values: dict, key: str) -> str:
    return json.dumps(values[key], default=str) if key in values else "absent"


def differences(a: dict, b: dict) -> list[str]:
    """Return what differs between two identities: family, layers, heads, config fields, tensors, files."""
    out = [
        f"{name} {a.get(name)} -> {b.get(name)}"
        for name in ("family", "layers", "heads", "kv_heads")
        if a.get(name) is not None and b.get(name) is not None and a[name] != b[name]
    ]
    out += _changes("config field", a.get("config") or {}, b.get("config") or {})
    if "tensors" in a and "tensors" in b:
        out += _changes("tensor", a["tensors"], b["tensors"])
    elif "files" in a and "files" in b:
        out += _changes("weight file", a["files"], b["files"])
    elif set(a) & {"tensors", "files"} != set(b) & {"tensors", "files"}:
        out.append(
            f"weights recorded as {a.get('kind')} {_weights_kind(a)} -> {b.get('kind')} {_weights_kind(b)}"
        )
    return out or [f"model digest {a.get('digest')} -> {b.get('digest')}"]


# Config fields that do not change what a head computes (initialisation, generation and output settings): a head
# set found on a model that differs from the one loaded only in these, or in its weights' dtypes (a bf16 re-save),
# holds for it, with a warning recorded in the run's manifest.
BENIGN = frozenset(
    {
        "initializer_range", "use_cache", "output_attentions", "output_hidden_states", "return_dict",
        "temperature", "top_p", "top_k", "do_sample", "max_length", "min_length", "max_new_tokens",
        "num_beams", "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "num_return_sequences",
        "typical_p", "early_stopping", "chunk_size_feed_forward", "tf_legacy_loss", "torchscript",
    }
)  # fmt: skip


def _shape(spec: str) -> str:
    """Return the shape of a tensor's "DTYPE[shape]" record (its dtype dropped)."""
    return spec[spec.find("[") :] if "[" in spec else spec


def judge(a: dict, b: dict) -> tuple[list[str], list[str]]:
    """Return (what makes the heads of `a` mean something else on `b`, what differs without changing that).

    Refused: the family, the layer / head / KV-head counts, any config field outside `BENIGN` (architecture,
    rope), a tensor's name or shape, a weight file's content. Benign: `BENIGN` config fields and the weights'
    dtypes (a re-save in bf16 of the same tensors). Two identities that are one model: ([], []).

    Examples:
        >>> a = {"digest": "1", "config": {"initializer_range": 0.02}, "tensors": {"w": "F32[2, 2]"}}
        >>> judge(a, {**a, "digest": "2", "config": {"initializer_range": 0.01}, "tensors": {"w": "BF16[2, 2]"}})
        ([], ['config field initializer_range: 0.02 -> 0.01', 'tensor dtypes of 1 tensor(s): F32 -> BF16'])
        >>> judge(a, {**a, "digest": "3", "config": {"rope_theta": 1e6}})[0]
        ['config field rope_theta: absent -> 1000000.0']
    """
    if same(a, b):
        return [], []
    serious = [
        f"{name} {a.get(name)} -> {b.get(name)}"
        for name in ("family", "layers", "heads", "kv_heads")
        if a.get(name) is not None and b.get(name) is not None and a[name] != b[name]
    ]
    ca, cb = a.get("config") or {}, b.get("config") or {}
    fields = sorted(k for k in set(ca) | set(cb) if ca.get(k, ...) != cb.get(k, ...))
    benign = [k for k in fields if k.rsplit(".", 1)[-1] in BENIGN]
    serious += _changes("config field", {k: ca[k] for k in fields if k in ca and k not in benign},
                        {k: cb[k] for k in fields if k in cb and k not in benign})  # fmt: skip
    notes = _changes(
        "config field", {k: ca[k] for k in benign if k in ca}, {k: cb[k] for k in benign if k in cb}
    )
    if "tensors" in a and "tensors" in b:
        ta, tb = a["tensors"], b["tensors"]
        shapes = _changes(
            "tensor", {k: _shape(v) for k, v in ta.items()}, {k: _shape(v) for k, v in tb.items()}
        )
        serious += shapes
        if not shapes:
            dtypes = {k for k in ta if ta[k] != tb[k]}
            if dtypes:
                was = sorted({ta[k][: ta[k].find("[")] for k in dtypes})
                now = sorted({tb[k][: tb[k].find("[")] for k in dtypes})
                notes.append(f"tensor dtypes of {len(dtypes)} tensor(s): {'/'.join(was)} -> {'/'.join(now)}")
    elif "files" in a and "files" in b:
        serious += _changes("weight file", a["files"], b["files"])
    elif set(a) & {"tensors", "files"} != set(b) & {"tensors", "files"}:
        serious.append(
            f"weights recorded as {a.get('kind')} {_weights_kind(a)} -> {b.get('kind')} {_weights_kind(b)}"
        )
    if not serious and not notes:
        serious.append(f"model digest {a.get('digest')} -> {b.get('digest')}")
    return serious, notes


def _weights_kind(ident: dict) -> str:
    return "safetensors headers" if "tensors" in ident else "file hashes" if "files" in ident else "nothing"


def explain(a: dict, b: dict) -> str:
    """Return "A; now B; what differs: ..." for a refusal."""
    return f"{describe(a)}, not {describe(b)}; what differs: {'; '.join(differences(a, b))}"
