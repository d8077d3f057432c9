"""The organism's training schedule: phased task joining, weighted interleaving, curriculum floors."""

from __future__ import annotations

from collections import Counter

import pytest

from corelens.organism.train import TaskSchedule, TrainConfig, curriculum_floor


def _run(cfg: TrainConfig, levels: dict[int, dict[str, float]] | None = None) -> list[str]:
    """Return the task of every step; tasks whose answers have not joined yet are prefixed "aux:"."""
    schedule, level, order = TaskSchedule(cfg), dict.fromkeys(cfg.tasks, 0.0), []
    for step in range(cfg.steps):
        level.update((levels or {}).get(step, {}))
        task, answers = schedule.next(step, level)
        order.append(task if answers else f"aux:{task}")
    return order


def test_tasks_join_in_order_at_their_deadlines():
    cfg = TrainConfig(steps=40, task_weights=(1.0, 1.0, 1.0), join_by=(0.0, 0.25, 0.5), aux_only_weight=0)
    order = _run(cfg)
    assert set(order[:10]) == {"image"}
    assert set(order[10:20]) == {"image", "video"}
    assert set(order[20:]) == set(cfg.tasks)
    # A task that joins first trains within the next two steps (its credit starts at zero).
    assert 10 <= order.index("video") <= 11 and 20 <= order.index("document") <= 22


def test_a_task_joins_early_once_the_previous_one_reaches_the_join_level():
    cfg = TrainConfig(
        steps=40, task_weights=(1.0, 1.0, 1.0), join_level=0.6, join_by=(0.0, 0.5, 0.9), aux_only_weight=0
    )
    order = _run(cfg, {5: {"image": 0.6}, 12: {"video": 0.7}})
    assert set(order[:5]) == {"image"}
    assert 5 <= order.index("video") <= 6
    assert 12 <= order.index("document") <= 14


def test_tasks_not_joined_yet_train_the_vision_tower_at_their_share():
    cfg = TrainConfig(
        steps=100, task_weights=(2.0, 1.0, 1.0), join_by=(0.0, 0.5, 0.75), aux_only_weight=0.5, aux_until=0.9
    )
    order = _run(cfg)
    first = Counter(order[:50])  # image answers (weight 2) against video and document pictures (0.5 each)
    assert abs(first["image"] - 100 / 3) <= 1 and sum(first.values()) == 50
    assert abs(first["aux:video"] - first["aux:document"]) <= 1
    assert "aux:video" not in order[50:] and "aux:document" not in order[75:]
    assert Counter(order[75:90]).keys() == {"image", "video", "document"}
    assert Counter(order[90:]).keys() == {"image", "video", "document"}  # the auxiliary loss is off


def test_joined_tasks_follow_their_weights():
    cfg = TrainConfig(steps=600, task_weights=(2.0, 1.0, 1.0), join_by=())
    counts = Counter(_run(cfg))
    assert counts == {"image": 300, "video": 150, "document": 150}


def test_schedule_rejects_mismatched_settings():
    with pytest.raises(ValueError, match="task weights"):
        TaskSchedule(TrainConfig(task_weights=(1.0, 1.0)))
    with pytest.raises(ValueError, match="join_by"):
        TaskSchedule(TrainConfig(join_by=(0.0, 0.5)))


def test_curriculum_floor_rises_from_the_join_step():
    cfg = TrainConfig(steps=100, curriculum_until=0.8)
    assert curriculum_floor(0, 0, cfg) == 0.0
    assert curriculum_floor(40, 0, cfg) == pytest.approx(0.5)
    assert curriculum_floor(50, 40, cfg) == pytest.approx(0.25)  # joined at 40: 10 of the 40 steps to 80
    assert curriculum_floor(30, 40, cfg) == 0.0
    assert curriculum_floor(90, 40, cfg) == 1.0
    assert curriculum_floor(5, 85, cfg) == 1.0  # joined after the floor's end: full difficulty at once
