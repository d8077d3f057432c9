"""DuoAttention and SparseMM formats: corelens -> format -> corelens gives the same set (and ranking)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from corelens.errors import CorelensError
from corelens.heads import HeadSet
from corelens.heads.formats import (
    DUO_TSV,
    kv_values,
    read_duo,
    read_sparsemm,
    write_duo,
    write_sparsemm,
)


def _headset(layers, heads, kv, seed=0):
    rng = np.random.default_rng(seed)
    rows = [
        {"layer": lyr, "head": hd, "mass": rng.random(), "n": 5}
        for lyr in range(layers)
        for hd in range(heads)
    ]
    table = pd.DataFrame(rows).sort_values("mass", ascending=False)
    table["rank"] = np.arange(1, len(table) + 1)
    return HeadSet({"layers": layers, "heads": heads, "kv_heads": kv, "config_hash": "abc"}, table)


def _kv_closure(heads, group):
    return sorted({(lyr, g * group + i) for lyr, hd in heads for g in [hd // group] for i in range(group)})


@pytest.mark.parametrize("keep", [1, 5, 11, 24])
def test_duo_round_trip_without_gqa_is_exact(tmp_path, keep):
    hs = _headset(3, 8, 8, seed=keep)
    back = read_duo(write_duo(hs, tmp_path / "duo", keep, sink=4, window=16))
    assert back.keep == keep and sorted(back.top()) == sorted(hs.top(keep))
    # The whole ranking survives too: one value per KV head, ordered as the ranks.
    assert back.top(24) == hs.top(24)
    assert back.provenance["sink"] == 4 and back.provenance["window"] == 16
    assert back.model["config_hash"] == "abc"  # what corelens knew travels in config.json


def test_duo_gqa_maps_query_heads_to_kv_heads(tmp_path):
    hs = _headset(3, 8, 2, seed=1)  # 4 query heads per KV head
    for keep in (1, 3, 7):
        values = kv_values(hs, keep)
        assert values.shape == (3, 2) and ((values > 0) & (values <= 1)).all()
        full = values >= 0.5
        # A KV head is full exactly when one of its query heads is in the set.
        assert {(lyr, g) for lyr, g in zip(*np.nonzero(full))} == {(lyr, hd // 4) for lyr, hd in hs.top(keep)}
        back = read_duo(write_duo(hs, tmp_path / f"d{keep}", keep))
        assert sorted(back.top()) == _kv_closure(hs.top(keep), 4)
        # kvpress's DuoAttentionPress streams the lowest `ratio` share of KV heads: exactly the others.
        n_stream = int((~full).sum())
        lowest = np.argsort(values, axis=None)[:n_stream]
        assert set(lowest) == set(np.flatnonzero(~full))
    closed = _kv_closure(hs.top(3), 4)  # a set of whole KV groups round-trips exactly
    table = hs.heads.assign(rank=[1 + (lh not in closed) * 100 + i for i, lh in enumerate(hs.top(24))])
    grouped = HeadSet(hs.model, table, len(closed))
    assert sorted(read_duo(write_duo(grouped, tmp_path / "closed")).top()) == closed


def test_duo_reads_a_pattern_written_as_duo_attention_writes_it(tmp_path):
    # np.savetxt's default format and no num_attention_heads: values outside [0, 1] are clipped.
    folder = tmp_path / "pattern"
    folder.mkdir()
    np.savetxt(folder / DUO_TSV, np.array([[1.2, 0.1], [0.4, 0.7]]), delimiter="\t")
    (folder / "config.json").write_text(json.dumps({"sink_size": 64, "recent_size": 256}))
    hs = read_duo(folder, heads=4)
    assert sorted(hs.top()) == [(0, 0), (0, 1), (1, 2), (1, 3)] and hs.model["kv_heads"] == 2
    with pytest.raises(CorelensError, match="do not split"):
        read_duo(folder, heads=3)
    with pytest.raises(CorelensError, match="not a DuoAttention pattern"):
        read_duo(tmp_path)


@pytest.mark.parametrize("keep", [1, 6, 20])
def test_sparsemm_round_trip(tmp_path, keep):
    hs = _headset(4, 6, 6, seed=keep)
    chosen, scores = write_sparsemm(hs, tmp_path, keep)
    plain = json.loads(chosen.read_text())
    assert sorted(plain) == ["0", "1", "2", "3"]
    assert sum(len(v) for v in plain.values()) == keep
    back = read_sparsemm(chosen, heads=6)
    assert back.keep == keep and sorted(back.top()) == sorted(hs.top(keep))
    ranked = read_sparsemm(scores)  # SparseMM's {"L-H": [scores]}: every head, ranked as corelens ranked it
    assert ranked.top(24) == hs.top(24) and ranked.model == {"layers": 4, "heads": 6}


def test_sparsemm_errors(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"0": [1], "2": [3]}))
    with pytest.raises(CorelensError, match="number of heads"):
        read_sparsemm(path)
    with pytest.raises(CorelensError, match="outside"):
        read_sparsemm(path, heads=3)
    assert sorted(read_sparsemm(path, heads=4).top()) == [(0, 1), (2, 3)]
    path.write_text("[1, 2]")
    with pytest.raises(CorelensError, match="JSON object"):
        read_sparsemm(path)
