"""Training the organism from scratch on the CPU: fresh synthetic samples every step, loss on the answer.

Every step renders new samples of one task, so the model never sees a sample twice and its running
training accuracy is already a held-out estimate. Tasks join in phases (`TaskSchedule`): the image task
trains alone until its conditional lookup forms, then video joins, then document, each interleaved by
weight with those already in. The loss is the cross-entropy of the answer tokens and the `<|im_end|>`
that follows them (labels -100 everywhere else); AdamW with linear warm-up and cosine decay.
"""

from __future__ import annotations

import math
import platform
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from corelens.errors import OptionError
from corelens.organism.architecture import FAMILY, build_model, build_processor, count_parameters
from corelens.organism.aux import AuxHeads, batch_labels
from corelens.organism.batch import IGNORE, encode
from corelens.organism.config import TrainConfig
from corelens.organism.tasks import TASKS, questions, render
from corelens.runs import write_json


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Return the learning rate at `step`: linear warm-up, then cosine decay to `min_lr`."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


class TaskSchedule:
    """Which task each step trains: every task interleaved deterministically by `task_weights`, in phases.

    A task's answers join in order (`TrainConfig.join_by`): a task whose lookup forms late first trains
    alone; the next one joins when it reaches `join_level` or at its deadline. Until then its steps train
    only the vision tower's auxiliary loss, at `aux_only_weight` of its weight (none once that loss has
    faded out).
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        weights = list(cfg.task_weights) or [1.0] * len(cfg.tasks)
        if len(weights) != len(cfg.tasks):
            raise OptionError(f"{len(weights)} task weights for {len(cfg.tasks)} tasks")
        if cfg.join_by and len(cfg.join_by) != len(cfg.tasks):
            raise OptionError(f"{len(cfg.join_by)} join_by entries for {len(cfg.tasks)} tasks")
        self.weights = dict(zip(cfg.tasks, weights))
        self.joined = {t: 0 for t in (cfg.tasks if not cfg.join_by else cfg.tasks[:1])}
        self.credit = dict.fromkeys(cfg.tasks, 0.0)

    def _join_due(self, step: int, level: dict[str, float]) -> bool:
        k = len(self.joined)
        if k >= len(self.cfg.tasks):
            return False
        previous = self.cfg.tasks[k - 1]
        return level[previous] >= self.cfg.join_level or step >= self.cfg.join_by[k] * self.cfg.steps

    def next(self, step: int, level: dict[str, float]) -> tuple[str, bool]:
        """Return the task of `step` and whether its answers train (False: vision auxiliary loss only)."""
        while self._join_due(step, level):
            self.joined[self.cfg.tasks[len(self.joined)]] = step
        aux_only = self.cfg.aux_only_weight if aux_scale(step, self.cfg) > 0 else 0.0
        share = {t: w * (1.0 if t in self.joined else aux_only) for t, w in self.weights.items()}
        total = sum(share.values())
        for t, w in share.items():
            if w > 0:
                self.credit[t] += w / total
        task = max((t for t, w in share.items() if w > 0), key=lambda t: self.credit[t])
        self.credit[task] -= 1.0
        return task, task in self.joined


def aux_scale(step: int, cfg: TrainConfig) -> float:
    """Return the auxiliary loss weight at `step`: `aux_weight`, fading linearly to 0 at `aux_until`."""
    end = cfg.aux_until * cfg.steps
    return cfg.aux_weight * max(0.0, 1.0 - step / end) if end > 0 else 0.0


def curriculum_floor(step: int, joined: int, cfg: TrainConfig) -> float:
    """Return the least scene difficulty of a task that joined at step `joined`: 0 rising linearly to 1.

    The floor reaches 1 (every task at full difficulty) at `curriculum_until` of the steps.
    """
    end = cfg.curriculum_until * cfg.steps
    if end <= joined:
        return 1.0
    return min(1.0, max(0.0, (step - joined) / (end - joined)))


def answer_loss(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the mean cross-entropy of the labelled tokens and whether each sample's own answer was argmax."""
    labels, at, length = batch["labels"], batch["answer_at"], batch["answer_len"]
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "answer_at", "answer_len")}
    logits = model(**inputs, use_cache=False).logits.float()
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=IGNORE
    )
    offsets = torch.arange(int(length.max()))
    positions = (at[:, None] + offsets[None, :]).clamp(max=labels.shape[1] - 1)
    rows = torch.arange(len(at))[:, None]
    hit = logits[rows, positions - 1].argmax(-1) == labels[rows, positions]
    correct = (hit | (offsets[None, :] >= length[:, None])).all(-1)  # every token of the own answer
    return loss, correct


def vision_tower(model, batch: dict) -> torch.Tensor:
    """Run only the vision tower on a one-task batch's images or video; return its merged visual tokens."""
    if "pixel_values" in batch:
        return model.model.visual(batch["pixel_values"], grid_thw=batch["image_grid_thw"]).pooler_output
    return model.model.visual(batch["pixel_values_videos"], grid_thw=batch["video_grid_thw"]).pooler_output


def extra_turns(record: dict, count: int, seed: int, index: int) -> list[tuple[str, str]]:
    """Return up to `count` other questions about the same scene, drawn deterministically."""
    own = (record["question"], record["answer"])
    pool = [q for q in questions(record) if q != own]
    rng = np.random.default_rng([seed, 7, TASKS.index(record["task"]), index])
    return [pool[i] for i in rng.permutation(len(pool))[:count]]


def save_checkpoint(out: Path, model, processor, record: dict) -> None:
    """Write the model, its processor and the training record to `out` (the record last)."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    write_json(out / "training.json", record)


def train(out: str | Path, cfg: TrainConfig, *, argv: list[str] | None = None, log=print) -> dict:
    """Train an organism from scratch with `cfg`; save checkpoint + `training.json` to `out`; return the log."""
    out = Path(out)
    torch.set_num_threads(cfg.threads)
    processor = build_processor()
    model = build_model(cfg.model, processor, seed=cfg.seed)
    model.train()
    heads = AuxHeads(model.get_input_embeddings(), processor.tokenizer)
    captured: dict[str, torch.Tensor] = {}
    hook = model.model.visual.register_forward_hook(
        lambda _m, _i, out: captured.__setitem__("features", out.pooler_output)
    )
    own = [(n, p) for n, p in heads.named_parameters() if not n.startswith("embeddings.")]
    named = [*model.named_parameters(), *(("aux." + n, p) for n, p in own)]
    decay = [p for n, p in named if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in named if not (p.ndim >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )
    schedule = TaskSchedule(cfg)
    counters = dict.fromkeys(cfg.tasks, 0)
    recent = {t: deque(maxlen=max(1, cfg.curriculum_window)) for t in cfg.tasks}
    level = dict.fromkeys(cfg.tasks, 0.0)
    losses: deque = deque(maxlen=cfg.log_every)
    aux_losses: deque = deque(maxlen=cfg.log_every)
    history = []
    start, cpu_start = time.time(), time.process_time()
    data_time = 0.0
    log(f"organism: {FAMILY}, {count_parameters(model):,} parameters; {cfg.steps} steps of {cfg.batch}")
    steps_done = 0

    def progress(finished: bool) -> dict:
        return {
            "command": " ".join(argv) if argv else " ".join(sys.argv),
            "family": FAMILY,
            "parameters": count_parameters(model),
            "config": cfg.to_dict(),
            "finished": finished,
            "steps_done": steps_done,
            "samples_seen": dict(counters),
            "wall_seconds": round(time.time() - start, 1),
            "cpu_seconds": round(time.process_time() - cpu_start, 1),
            "data_seconds": round(data_time, 1),
            "threads": cfg.threads,
            "machine": {
                "platform": platform.platform(),
                "processor": platform.processor(),
                "python": sys.version.split()[0],
            },
            "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
            "history": history,
        }

    for step in range(cfg.steps):
        task, answers = schedule.next(step, level)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg)
        t0 = time.time()
        first = counters[task]
        if answers:
            level[task] = max(level[task], curriculum_floor(step, schedule.joined[task], cfg))
        samples = [render(task, first + i, cfg.data_seed, level[task]) for i in range(cfg.batch)]
        counters[task] += cfg.batch
        extra = (
            [extra_turns(s.record, cfg.turns - 1, cfg.data_seed, first + i) for i, s in enumerate(samples)]
            if answers
            else ()
        )
        batch = encode(processor, samples, answers=answers, extra=extra)
        scale = aux_scale(step, cfg)
        aux_targets = batch_labels(samples) if scale > 0 else {}
        data_time += time.time() - t0
        if answers:
            loss, correct = answer_loss(model, batch)
        else:
            vision_tower(model, batch)  # the hook captures the merged visual tokens
            loss = correct = None
        zero = next(model.parameters()).new_zeros(())
        aux = heads.loss(captured.pop("features"), aux_targets) if scale > 0 else zero
        captured.clear()
        total = (zero if loss is None else loss) + scale * aux
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in named], cfg.grad_clip)
        optimizer.step()
        aux_losses.append(aux.item())
        steps_done = step + 1
        if loss is not None:
            losses.append(loss.item())
            recent[task].append(correct.float().mean().item())
            window = recent[task]
            if (
                level[task] < 1.0
                and len(window) == window.maxlen
                and sum(window) / len(window) >= cfg.curriculum_bar
            ):
                level[task] = min(1.0, level[task] + cfg.curriculum_step)  # mastered: harder scenes
                window.clear()
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            entry = {
                "step": step + 1,
                "seconds": round(time.time() - start, 1),
                "cpu_seconds": round(time.process_time() - cpu_start, 1),
                "lr": learning_rate(step, cfg),
                "loss": round(sum(losses) / max(1, len(losses)), 4),
                "aux_loss": round(sum(aux_losses) / len(aux_losses), 4),
                "accuracy": {t: round(sum(v) / len(v), 4) for t, v in recent.items() if v},
                "level": {t: round(v, 2) for t, v in level.items()},
                "joined": dict(schedule.joined),
            }
            history.append(entry)
            accs = " ".join(f"{t}={a:.2f}@{level[t]:.1f}" for t, a in entry["accuracy"].items())
            log(
                f"step {entry['step']:5d}  {entry['seconds']:7.0f}s  loss {entry['loss']:.3f}  "
                f"aux {entry['aux_loss']:.3f}  {accs}"
            )
            if cfg.save_every and steps_done % cfg.save_every == 0:
                save_checkpoint(out, model, processor, progress(finished=False))  # never lose finished work
            if cfg.time_limit and time.time() - start > cfg.time_limit:
                log(f"time limit of {cfg.time_limit:.0f} s reached: stopping after step {step + 1}")
                break
    hook.remove()
    model.eval()
    record = progress(finished=True)
    save_checkpoint(out, model, processor, record)
    log(f"trained {record['steps_done']} steps in {record['wall_seconds']:.0f} s; saved {out}")
    return record
