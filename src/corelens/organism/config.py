"""The organism's sizes (`OrganismConfig`) and training settings (`TrainConfig`): plain dataclasses.

Kept apart from the model and the training loop (which import torch and transformers) so that the
`organism train` parser shows their defaults without importing either.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from corelens.errors import CorelensError, OptionError
from corelens.organism.tasks import TASKS


@dataclass(frozen=True)
class OrganismConfig:
    """Sizes of the organism (text decoder and vision tower)."""

    hidden: int = 128
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 384
    vision_depth: int = 2
    vision_hidden: int = 64
    vision_heads: int = 4
    vision_intermediate: int = 128
    window_size: int = 112
    init_std: float = 0.08  # std of the normal initialisation of every weight matrix

    def __post_init__(self) -> None:
        # Qwen2.5-VL's text attention derives its head size from hidden / heads; rope sections from head_dim.
        if self.heads * self.head_dim != self.hidden or self.heads % self.kv_heads:
            raise OptionError(
                f"organism sizes: need heads x head_dim = hidden and kv_heads dividing heads, got heads "
                f"{self.heads}, head_dim {self.head_dim}, hidden {self.hidden}, kv_heads {self.kv_heads}"
            )

    @classmethod
    def sized(cls, *, layers: int, heads: int, hidden: int) -> OrganismConfig:
        """Return the default organism resized: head_dim = hidden / heads, MLP = 3 x hidden."""
        if hidden % heads:
            raise CorelensError(f"--hidden {hidden} is not a multiple of --heads {heads}")
        return cls(
            layers=layers, heads=heads, hidden=hidden, head_dim=hidden // heads, intermediate=3 * hidden
        )

    def to_dict(self) -> dict:
        """Return the sizes as a plain dict."""
        return asdict(self)


TRAIN_DATA_SEED = 0  # training samples come from seed 0; evaluation and the demo use other seeds


@dataclass
class TrainConfig:
    """Optimisation settings of one training run."""

    steps: int = 9000
    batch: int = 16
    turns: int = 8  # questions per rendered scene: its own + up to turns - 1 extra chat turns
    aux_weight: float = 1.0  # weight of the vision tower's per-token auxiliary loss (organism/aux.py)
    aux_until: float = 0.6  # share of the steps after which the auxiliary loss has faded linearly to 0
    curriculum_until: float = 0.8  # share of the steps by which every task has reached full difficulty
    curriculum_step: float = 0.1  # level gained when a task's running accuracy passes `curriculum_bar`
    curriculum_bar: float = 0.8
    curriculum_window: int = 40  # steps of a task whose running accuracy decides its next level
    # Phases: task k + 1 joins the mix once task k reaches `join_level`, or at `join_by[k + 1]` of the steps
    # at the latest (the first task trains alone until then); empty `join_by` = every task from step 0.
    join_level: float = 0.6
    join_by: tuple[float, ...] = (0.0, 0.3, 0.45)
    # Before its answers join, a task's pictures still train the vision tower (auxiliary loss only), in
    # steps weighted by this share of the task's weight, so that every task's visual features (motion
    # above all) form from the start; 0 = a task is absent until it joins.
    aux_only_weight: float = 0.5
    lr: float = 3e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    data_seed: int = TRAIN_DATA_SEED
    tasks: tuple[str, ...] = TASKS
    task_weights: tuple[float, ...] = (1.0, 1.5, 1.0)  # relative share of steps per task; empty = equal
    threads: int = 2
    log_every: int = 25
    save_every: int = 500  # steps between checkpoints written to `out` (training.json says finished: false)
    time_limit: float = 0.0  # seconds; stop early (after a log line) when exceeded, 0 = none
    model: OrganismConfig = field(default_factory=OrganismConfig)

    def to_dict(self) -> dict:
        """Return the settings as a plain dict."""
        out = asdict(self)
        out["tasks"] = list(self.tasks)
        out["task_weights"] = list(self.task_weights)
        out["join_by"] = list(self.join_by)
        return out
