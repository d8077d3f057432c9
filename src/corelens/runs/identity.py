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

Beside the digest (and outside it, so identities recorded before it still match), a fingerprint of the weights'
content: a few values (`content_values`: the first `VALUES` of the first, middle and last row of `PICKED`
matrices spread over the sorted tensor names) read as fp32 through the safetensors slices, never a whole
tensor. Two checkpoints of one config and one shape whose values differ (another seed, a fine-tune) are two
models; the same values re-saved in another dtype agree within that dtype's rounding (`ROUNDING`).

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
PICKED, VALUES = 4, 8  # the content fingerprint: VALUES values of 3 rows of PICKED matrices (96 numbers)
# Two values agree across a dtype re-save when they differ by less than bf16's rounding (8 significant bits, a
# relative step of 2^-8; fp16 rounds finer) plus an absolute floor for values fp16 stores as subnormals.
ROUNDING, FLOOR = 2.0**-7, 1e-6
# safetensors' dtype names as torch's, so a folder's record and a model in memory compare.
DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


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


def _picked(shapes: dict[str, list[int]]) -> list[str]:
    """Return the names of the `PICKED` tensors the content fingerprint reads: matrices (no norm or bias,
    which start equal in every model), spread evenly over the sorted names."""
    names = sorted(n for n, shape in shapes.items() if len(shape) >= 2 and all(shape))
    if len(names) <= PICKED:
        return names
    return [names[round(i * (len(names) - 1) / (PICKED - 1))] for i in range(PICKED)]


def _rows(shape: list[int]) -> list[tuple[slice, ...]]:
    """Return the slices of the first, middle and last row (first index of every dimension but the first and
    the last) of a tensor of `shape`, `VALUES` values each."""
    rows = sorted({0, shape[0] // 2, shape[0] - 1})
    return [(slice(r, r + 1), *[slice(0, 1)] * (len(shape) - 2), slice(0, VALUES)) for r in rows]


def _values(tensors: list) -> list[float]:
    return [float(v) for t in tensors for v in t.float().flatten().tolist()]


def content_values(shapes: dict[str, list[int]], read) -> dict[str, list[float]]:
    """Return {tensor name: its fingerprint values as fp32} for the `_picked` tensors; `read(name, index)`
    returns the slice `index` of a tensor (a safetensors slice or a tensor in memory).

    Examples:
        >>> import torch
        >>> state = {"a.weight": torch.arange(12.0).reshape(3, 4), "a.bias": torch.zeros(3)}
        >>> content_values({k: list(v.shape) for k, v in state.items()}, lambda n, i: state[n][i])
        {'a.weight': [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]}
    """
    return {name: _values([read(name, index) for index in _rows(shapes[name])]) for name in _picked(shapes)}


def _folder_content(shards: list[Path], tensors: dict[str, str]) -> dict[str, list[float]]:
    """Return the content fingerprint of a checkpoint's float tensors, each value read from its shard's slice."""
    from safetensors import safe_open

    opened = [safe_open(str(shard), framework="pt") for shard in shards]
    where = {name: f for f in opened for name in f.keys()}  # noqa: SIM118 - safe_open has keys(), no iteration
    floats = {n: json.loads(_shape(spec)) for n, spec in tensors.items() if _dtype(spec) in DTYPES.values()}
    return content_values(floats, lambda name, index: where[name].get_slice(name)[index])


def weights_of_folder(folder: Path) -> dict[str, Any]:
    """Return the weights' metadata of a checkpoint folder: tensors from safetensors headers (and the content
    fingerprint, `content_values`), else file hashes."""
    shards = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    if shards:
        # Sharded or not, a tensor's name, dtype and shape are what the model is; the shard it sits in is not.
        tensors: dict[str, str] = {}
        for shard in shards:
            tensors.update(safetensors_tensors(shard))
        tensors = dict(sorted(tensors.items()))
        return {"tensors": tensors, "content": _folder_content(shards, tensors)}
    others = sorted(p for p in folder.iterdir() if p.suffix in OTHER_WEIGHTS and p.is_file())
    return {"files": {p.name: file_digest(p) for p in others}}


def weights_of_state(state: dict) -> dict[str, Any]:
    """Return the weights' metadata of a model kept in memory (no folder): its state dict's names, dtypes, shapes
    and the content fingerprint (`content_values`)."""
    # Float tensors holding values (not on the meta device of an offloaded model) carry the fingerprint.
    floats = {n: list(t.shape) for n, t in state.items() if t.is_floating_point() and t.device.type != "meta"}
    return {
        "tensors": {
            name: f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for name, t in sorted(state.items())
        },
        "content": content_values(floats, lambda name, index: state[name][index].detach()),
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
    # The content fingerprint stays outside the digest: identities recorded before it keep their digest.
    metadata = {k: v for k, v in weights.items() if k != "content"}
    return {
        "digest": _digest({"config": clean, "weights": metadata}),
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
    an identity made from a config alone (kind "config": no weights known) agrees on the config's digest. One
    digest with another weights' content (both recorded) is two models: another seed or a fine-tune."""
    if a.get("digest") == b.get("digest"):
        return not (a.get("content") and b.get("content") and a["content"] != b["content"])
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


def _counts(a: dict, b: dict) -> list[str]:
    """Return the family and layer / head / KV-head counts that differ (where both identities record them)."""
    return [
        f"{name} {a.get(name)} -> {b.get(name)}"
        for name in ("family", "layers", "heads", "kv_heads")
        if a.get(name) is not None and b.get(name) is not None and a[name] != b[name]
    ]


def _other_weights(a: dict, b: dict) -> list[str]:
    """Return what differs in weights recorded without tensors on both sides: weight-file hashes, or the way
    the weights were recorded (tensors on one side, files on the other)."""
    if "files" in a and "files" in b:
        return _changes("weight file", a["files"], b["files"])
    if set(a) & {"tensors", "files"} != set(b) & {"tensors", "files"}:
        return [
            f"weights recorded as {a.get('kind')} {_weights_kind(a)} -> {b.get('kind')} {_weights_kind(b)}"
        ]
    return []


def differences(a: dict, b: dict) -> list[str]:
    """Return what differs between two identities: family, layers, heads, config fields, tensors, files."""
    out = _counts(a, b) + _changes("config field", a.get("config") or {}, b.get("config") or {})
    if "tensors" in a and "tensors" in b:
        out += _changes("tensor", a["tensors"], b["tensors"])
        out += _content(a, b)[0]
    else:
        out += _other_weights(a, b)
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
    rope), a tensor's name or shape, the weights' content (`_content`; a weight file's hash). Benign: `BENIGN`
    config fields and the weights' dtypes (a re-save in bf16 of the same tensors). Two identities that are one model: ([], []).

    Examples:
        >>> a = {"digest": "1", "config": {"initializer_range": 0.02}, "tensors": {"w": "F32[2, 2]"}}
        >>> judge(a, {**a, "digest": "2", "config": {"initializer_range": 0.01}, "tensors": {"w": "BF16[2, 2]"}})
        ([], ['config field initializer_range: 0.02 -> 0.01', 'tensor dtypes of 1 tensor(s): F32 -> BF16'])
        >>> judge(a, {**a, "digest": "3", "config": {"rope_theta": 1e6}})[0]
        ['config field rope_theta: absent -> 1000000.0']
    """
    if same(a, b):
        return [], []
    serious = _counts(a, b)
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
            serious += _content(a, b)[0]
    else:
        serious += _other_weights(a, b)
    if not serious and not notes:
        serious.append(f"model digest {a.get('digest')} -> {b.get('digest')}")
    return serious, notes


def _dtype(spec: str | None) -> str | None:
    name = spec[: spec.find("[")] if spec and "[" in spec else spec
    return DTYPES.get(name or "", name)


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= ROUNDING * max(abs(x), abs(y)) + FLOOR


def _content(a: dict, b: dict) -> tuple[list[str], int]:
    """Return (the fingerprinted tensors whose values differ, how many agree only within a re-save's rounding).

    A tensor of one dtype in both must hold the very values; across dtypes (a bf16 re-save) each value must
    agree within `ROUNDING`. An identity without a fingerprint (recorded before it) is not compared.

    Examples:
        >>> a = {"tensors": {"w": "F32[2, 2]"}, "content": {"w": [0.1, 0.2]}}
        >>> _content(a, {"tensors": {"w": "BF16[2, 2]"}, "content": {"w": [0.10009765625, 0.2001953125]}})
        ([], 1)
        >>> _content(a, {**a, "content": {"w": [0.1, 0.2000001]}})
        (["weights' content of tensor w differs (another seed or a fine-tune, not a re-save)"], 0)
    """
    ca, cb = a.get("content") or {}, b.get("content") or {}
    differ, rounded = [], 0
    for name in sorted(set(ca) & set(cb)):
        x, y = ca[name], cb[name]
        if x == y:
            continue
        one_dtype = _dtype((a.get("tensors") or {}).get(name)) == _dtype((b.get("tensors") or {}).get(name))
        if not one_dtype and len(x) == len(y) and all(map(_close, x, y)):
            rounded += 1
        else:
            differ.append(name)
    shown = [
        f"weights' content of tensor {n} differs (another seed or a fine-tune, not a re-save)" for n in differ
    ]
    return shown[:NAMED] + (
        [f"and {len(differ) - NAMED} more tensors"] if len(differ) > NAMED else []
    ), rounded


def _weights_kind(ident: dict) -> str:
    return "safetensors headers" if "tensors" in ident else "file hashes" if "files" in ident else "nothing"


def explain(a: dict, b: dict) -> str:
    """Return "A; now B; what differs: ..." for a refusal."""
    return f"{describe(a)}, not {describe(b)}; what differs: {'; '.join(differences(a, b))}"
