"""The organism's model side: training batches equal the processor's, training runs, the shipped checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

import corelens
from corelens.cli import main
from corelens.data import read_samples
from corelens.errors import CorelensError
from corelens.experiments.evaluate import evaluate
from corelens.models.prepare import messages
from corelens.organism import CHECKPOINT, organism_path
from corelens.organism.architecture import OrganismConfig, build_model, build_processor, count_parameters
from corelens.organism.batch import encode
from corelens.organism.tasks import TASKS, generate, render
from corelens.organism.train import TrainConfig, train

# The trained checkpoint ships in the package; from a source tree without it these tests are skipped.
needs_checkpoint = pytest.mark.skipif(
    not (CHECKPOINT / "config.json").is_file(), reason="organism checkpoint not shipped yet (issue 3)"
)


@pytest.fixture(scope="module")
def processor():
    return build_processor()


@pytest.mark.parametrize("task", TASKS)
def test_training_batches_equal_the_processor_output(task, processor, tmp_path):
    samples, _ = read_samples(generate(task, tmp_path, 3, seed=9))
    rendered = [render(task, i, seed=9) for i in range(3)]
    texts = [
        processor.apply_chat_template(messages(s), add_generation_prompt=True, tokenize=False)
        + s.answer
        + "<|im_end|>"
        for s in samples
    ]
    images = [im for r in rendered for im in r.images] or None
    videos = [r.frames for r in rendered if r.frames] or None
    extra = {}
    if videos:
        fps = rendered[0].record["video"]["fps"]
        extra["videos_kwargs"] = {
            "video_metadata": [
                {"fps": fps, "total_num_frames": len(v), "frames_indices": list(range(len(v)))}
                for v in videos
            ]
        }
    want = processor(text=texts, images=images, videos=videos, padding=True, return_tensors="pt", **extra)
    got = encode(processor, rendered)
    for key, value in want.items():
        assert torch.equal(got[key].to(value.dtype), value), key
    answer_ids = processor.tokenizer([s.answer for s in samples], add_special_tokens=False)["input_ids"]
    rows = torch.arange(3)
    assert got["input_ids"][rows, got["answer_at"]].tolist() == [ids[0] for ids in answer_ids]
    assert got["answer_len"].tolist() == [len(ids) for ids in answer_ids]
    labelled = sum(len(ids) + 1 for ids in answer_ids)  # answer tokens + <|im_end|> per sample
    assert (got["labels"] != -100).sum().item() == labelled


def test_training_runs_and_changes_the_weights(tmp_path):
    small = OrganismConfig(
        hidden=32,
        layers=1,
        heads=2,
        kv_heads=1,
        head_dim=16,
        intermediate=32,
        vision_depth=1,
        vision_hidden=16,
        vision_heads=2,
        vision_intermediate=16,
    )
    cfg = TrainConfig(steps=3, batch=2, turns=2, warmup=1, log_every=1, model=small)
    record = train(tmp_path / "ckpt", cfg, argv=["test"], log=lambda _: None)
    assert record["steps_done"] == 3 and len(record["history"]) == 3
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in record["history"])
    initial = build_model(small, build_processor(), seed=cfg.seed).state_dict()
    m = corelens.load(tmp_path / "ckpt")
    trained = m.model.state_dict()
    changed = [k for k in initial if not torch.equal(initial[k], trained[k])]
    assert len(changed) > len(initial) // 2
    assert json.loads((tmp_path / "ckpt" / "training.json").read_text())["command"] == "test"


@needs_checkpoint
def test_shipped_checkpoint_loads_offline_with_the_stock_classes():
    path = organism_path()
    model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True)
    processor = AutoProcessor.from_pretrained(path, local_files_only=True)
    text = model.config.get_text_config()
    assert model.config.model_type in ("qwen2_5_vl", "qwen3_vl")
    assert text.num_hidden_layers >= 4 and text.num_attention_heads >= 8
    assert count_parameters(model) <= 10_000_000
    assert next(model.parameters()).dtype == torch.float32
    size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    assert size <= 25 * 2**20
    assert processor.tokenizer.convert_tokens_to_ids("red") != processor.tokenizer.unk_token_id
    assert (path / "CARD.md").is_file()


@pytest.mark.e2e
@needs_checkpoint
def test_shipped_checkpoint_reproduces_its_documented_accuracy(tmp_path):
    reference = json.loads((organism_path() / "reference.json").read_text())
    m = corelens.load(organism_path())
    for task in TASKS:
        samples, _ = read_samples(generate(task, tmp_path / task, reference["n"], seed=reference["seed"]))
        got = evaluate(m, samples).accuracy
        assert abs(got - reference["tasks"][task]) <= 0.03, (task, got, reference["tasks"][task])


@needs_checkpoint
def test_organism_eval_writes_the_tasks_table(tmp_path):
    out = tmp_path / "eval.json"
    assert (
        main(["organism", "eval", "--n", "2", "--seed", "3", "--baseline-train", "20", "--json", str(out)])
        == 0
    )
    result = json.loads(out.read_text())
    assert set(result["tasks"]) == set(TASKS)
    for row in result["tasks"].values():
        assert {"accuracy", "blank_accuracy", "chance", "n", "text_only_accuracy"} <= set(row)
        assert row["n"] == 2 and 0 < row["chance"] <= 0.2


def test_resized_organism_builds_and_runs(processor):
    """`organism train --hidden/--heads` sizes: head_dim follows hidden / heads; bad sizes are refused."""
    cfg = OrganismConfig.sized(layers=1, heads=4, hidden=64)
    assert (cfg.head_dim, cfg.intermediate) == (16, 192)
    model = build_model(cfg, processor)
    batch = encode(processor, [render("image", 0, seed=9)])
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "answer_at", "answer_len")}
    with torch.no_grad():
        assert model(**inputs).logits.shape[:2] == batch["input_ids"].shape
    with pytest.raises(CorelensError, match="multiple"):
        OrganismConfig.sized(layers=1, heads=3, hidden=64)
    with pytest.raises(ValueError, match="head_dim"):
        OrganismConfig(hidden=64, heads=4, head_dim=8)
