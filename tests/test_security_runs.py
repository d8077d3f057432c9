"""Run folders under attack or damage: planted links, two writers, a stale lock, damaged logs and manifests,
read-only files, a frozen torchrun rank. Each case ends in one line (or a warning) and leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corelens.cli import main
from corelens.organism.tasks import WORDS, generate


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("runsec")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    data = generate("image", root / "data", 4, seed=3)
    base = root / "base"
    assert main(_argv(model, data, base)) == 0
    return {"model": model, "data": data, "base": base}


def _argv(model, data, out, *extra) -> list[str]:
    return ["rank", "--model", str(model), "--data", str(data), "--out", str(out), "--overlays", "0", *extra]


def _copy(setup, tmp_path, drop_last: bool = False) -> Path:
    """Return a copy of the finished base run; `drop_last` leaves its last sample to do."""
    run = tmp_path / "run"
    shutil.copytree(setup["base"], run)
    if drop_last:
        lines = (run / "samples.jsonl").read_text().splitlines(keepends=True)
        (run / "samples.jsonl").write_text("".join(lines[:-1]))
    return run


def _rank(setup, run, capsys, *extra) -> tuple[int, str]:
    code = main(_argv(setup["model"], setup["data"], run, *extra))
    return code, capsys.readouterr().err


def _one_line(err: str, *names: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("corelens: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(name in lines[0] for name in names), lines[0]
    return lines[0]


def _strays(run: Path) -> list[Path]:
    return [p for p in run.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".")]


@pytest.mark.parametrize("name", ["samples.jsonl", "manifest.json", "heads.csv", "figures/heads_mass.png"])
def test_planted_link_is_refused_and_its_target_untouched(setup, tmp_path, capsys, name):
    run = _copy(setup, tmp_path)
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    (run / name).unlink()
    (run / name).symlink_to(target)
    code, err = _rank(setup, run, capsys)
    assert code == 2
    _one_line(err, str(run / name), "link")
    assert target.read_text() == "precious\n" and (run / name).is_symlink()
    assert not list(tmp_path.glob("victim.txt.*")) and not _strays(run)


def test_linked_figures_folder_is_refused(setup, tmp_path, capsys):
    run = _copy(setup, tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.rmtree(run / "figures")
    (run / "figures").symlink_to(outside)
    code, err = _rank(setup, run, capsys)
    assert code == 2
    _one_line(err, "outside", "figures")
    assert not list(outside.iterdir())


def test_stray_manifest_tmp_link_neither_blocks_nor_is_followed(setup, tmp_path, capsys):
    run = _copy(setup, tmp_path, drop_last=True)
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    (run / "manifest.json.tmp").symlink_to(target)
    code, err = _rank(setup, run, capsys)
    assert code == 0, err
    assert target.read_text() == "precious\n"
    assert json.loads((run / "manifest.json").read_text())["finished"]
    assert (run / "samples.jsonl").read_bytes() == (setup["base"] / "samples.jsonl").read_bytes()


def _lock(run: Path, pid: int) -> None:
    holder = {"pid": pid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00+0000"}
    (run / "run.lock").write_text(json.dumps(holder))


def test_second_writer_is_refused_naming_the_holder(setup, tmp_path, capsys):
    run = _copy(setup, tmp_path, drop_last=True)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _lock(run, holder.pid)
        before = (run / "samples.jsonl").read_bytes()
        code, err = _rank(setup, run, capsys)
        assert code == 2
        _one_line(err, f"pid {holder.pid}", socket.gethostname(), "2026-01-01T00:00:00")
        assert (run / "samples.jsonl").read_bytes() == before  # nothing ran
        assert json.loads((run / "run.lock").read_text())["pid"] == holder.pid  # its lock is kept
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.e2e  # two processes: a lock holder and a real `corelens rank`
def test_concurrent_rank_process_is_refused(setup, tmp_path):
    """A real second `corelens rank` into a folder a live run holds."""
    run = _copy(setup, tmp_path, drop_last=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom corelens.runs.lock import Lock\n"
                               f"Lock({str(run)!r}).acquire(); print('held', flush=True); time.sleep(120)"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        cmd = [sys.executable, "-m", "corelens", *_argv(setup["model"], setup["data"], run)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2
        _one_line(done.stderr, f"pid {holder.pid}", "another process is writing this run")
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_of_a_killed_run_is_taken_over(setup, tmp_path, capsys):
    run = _copy(setup, tmp_path, drop_last=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid no longer exists
    _lock(run, dead.pid)
    code, err = _rank(setup, run, capsys)
    assert code == 0, err
    assert "warning" in err and f"pid {dead.pid}" in err and "taking over" in err
    assert not (run / "run.lock").exists()  # released at the end
    assert (run / "samples.jsonl").read_bytes() == (setup["base"] / "samples.jsonl").read_bytes()


def test_lock_is_released_after_an_error(setup, tmp_path, capsys):
    run = _copy(setup, tmp_path)
    (run / "heads.csv").chmod(0o444)
    code, _ = _rank(setup, run, capsys)
    assert code == 2 and not (run / "run.lock").exists()


DAMAGE = {
    "garbage": b"this is not json",
    "nul": b"\0\0\0\0",
    "no-id": b'{"status": "ok", "layers": []}',
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_log_line_is_reported_then_repaired(setup, tmp_path, capsys, kind):
    run = _copy(setup, tmp_path, drop_last=True)
    lines = (run / "samples.jsonl").read_bytes().splitlines(keepends=True)
    damaged = b"".join(lines[:1] + [DAMAGE[kind] + b"\n"] + lines[1:])
    (run / "samples.jsonl").write_bytes(damaged)
    code, err = _rank(setup, run, capsys)
    assert code == 2
    _one_line(err, f"{run / 'samples.jsonl'}:2", "--repair-log")
    assert (run / "samples.jsonl").read_bytes() == damaged  # reported, not changed

    code, err = _rank(setup, run, capsys, "--repair-log")
    assert code == 0, err
    assert "dropped 1 damaged line" in err
    backups = list(run.glob("samples.jsonl.bak-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == damaged
    assert (run / "samples.jsonl").read_bytes() == (setup["base"] / "samples.jsonl").read_bytes()


def test_truncated_manifest_is_one_line(setup, tmp_path, capsys):
    run = _copy(setup, tmp_path)
    text = (run / "manifest.json").read_bytes()
    (run / "manifest.json").write_bytes(text[: len(text) // 2])
    code, err = _rank(setup, run, capsys)
    assert code == 2
    _one_line(err, str(run / "manifest.json"), "truncated")


@pytest.mark.parametrize("name", ["manifest.json", "samples.jsonl", "heads.csv", "figures/heads_mass.png"])
def test_read_only_file_is_named_and_leaves_no_temporary(setup, tmp_path, capsys, name):
    run = _copy(setup, tmp_path, drop_last=True)
    before = (run / name).read_bytes()
    (run / name).chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    code, err = _rank(setup, run, capsys)
    assert code == 2
    _one_line(err, str(run / name), "read-only")
    assert (run / name).read_bytes() == before and not _strays(run)


def _rank_pids(parent: int) -> dict[int, int]:
    """Return {RANK: pid} of the worker processes a torchrun agent started."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent:
            found.update({int(item[5:]): int(entry.name) for item in env if item.startswith(b"RANK=")})
    return found


@pytest.mark.e2e
def test_frozen_rank_is_reported_by_number(setup, tmp_path):
    out = tmp_path / "dist"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "CORELENS_DIST_TIMEOUT": "5"}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "corelens",
           *_argv(setup["model"], setup["data"], out)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: dict[int, int] = {}
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not (out / "manifest.json").is_file():
            pids = _rank_pids(proc.pid) or pids
            time.sleep(0.02)
        pids = _rank_pids(proc.pid) or pids
        os.kill(pids[1], signal.SIGSTOP)  # rank 0 has written the manifest: rank 1 is in the group
        while time.time() < deadline and Path(f"/proc/{pids[0]}").exists():
            time.sleep(0.1)  # rank 0 reports the frozen rank after CORELENS_DIST_TIMEOUT and ends
    finally:
        if 1 in pids:
            os.kill(pids[1], signal.SIGKILL)
        out_text, err_text = proc.communicate(timeout=120)
    log = out_text + err_text
    assert proc.returncode != 0
    lines = [line for line in log.splitlines() if line.startswith("corelens: error: [rank 0 of 2]")]
    assert len(lines) == 1 and "rank 1 did not answer within 5 s" in lines[0], log
    assert "its error is above" not in log and "run the same command again to resume" in lines[0]


def test_a_rank_frozen_inside_a_barrier_is_named_too():
    """Rank 1 arrived (its key is set) and froze inside gloo's barrier: rank 0's timeout names it all the same."""
    from torch.distributed import HashStore

    from corelens.cli import _peer_message
    from corelens.runs.dist import Dist, _absent

    store, key = HashStore(), "corelens/barrier/7"
    store.set(f"{key}/0", "1")
    assert _absent(Dist(rank=0, world=2), store, key) == "ranks 1 failed to reach the barrier"
    store.set(f"{key}/1", "1")
    assert _absent(Dist(rank=0, world=2), store, key) == "ranks 1 froze inside the barrier"
    assert _peer_message("Timed out\nranks 1 froze inside the barrier").startswith(
        "rank 1 did not answer within"
    )
    # Of three ranks, two still inside cannot be told apart from here: none is named.
    store.set(f"{key}/2", "1")
    assert "froze" not in _absent(Dist(rank=0, world=3), store, key)
    store.set(f"{key}/left/2", "1")
    assert _absent(Dist(rank=0, world=3), store, key) == "ranks 1 froze inside the barrier"
