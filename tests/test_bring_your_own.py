"""Bring your own model: a model the user loaded with sdpa is switched to corelens' attention, or refused."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

import corelens as cl
from corelens.attention.modules import decoder_attention_modules
from corelens.organism import organism_path
from corelens.organism.tasks import generate
from corelens.policies import ZeroHeads

TOP = [(0, 5), (0, 6), (0, 7)]  # the organism's top heads on image answers


def _user_model():
    """The organism loaded the way a user loads any checkpoint: transformers, stock sdpa attention."""
    model = AutoModelForImageTextToText.from_pretrained(organism_path(), attn_implementation="sdpa").eval()
    return model, AutoProcessor.from_pretrained(organism_path())


def _wrap(model, processor) -> cl.Loaded:
    return cl.Loaded(
        model, processor, organism_path(), model.config.model_type, decoder_attention_modules(model)
    )


def test_user_sdpa_model_is_switched_and_ablation_changes_logits(tmp_path, caplog):
    model, processor = _user_model()
    assert model.config.get_text_config()._attn_implementation == "sdpa"
    with caplog.at_level(logging.WARNING, logger="corelens.models.loaded"):
        m = _wrap(model, processor)
        _wrap(model, processor)  # already switched: nothing more said
    notes = [r.getMessage() for r in caplog.records if "corelens: note:" in r.getMessage()]
    assert len(notes) == 1 and "'sdpa' to 'corelens'" in notes[0], notes
    assert model.config.get_text_config()._attn_implementation == "corelens"
    assert model.config.vision_config._attn_implementation == "sdpa"  # vision tower untouched

    samples, _ = cl.read_samples(generate("image", tmp_path, 1, seed=1))
    prepared = cl.prepare(m, samples[0])
    inputs = prepared.inputs
    with torch.no_grad():
        plain = model(**inputs).logits[0, -1]
        with ZeroHeads(TOP).applied(m, prepared):
            ablated = model(**inputs).logits[0, -1]
    assert (plain - ablated).abs().max() > 1e-3  # the hooks ran: zeroing the top heads moves the answer


def test_model_that_cannot_switch_is_refused_in_one_line():
    model, processor = _user_model()

    def refuse(*_args, **_kwargs):
        raise ValueError("this class cannot change its attention")

    model.set_attn_implementation = refuse
    with pytest.raises(cl.UnsupportedModelError) as err:
        _wrap(model, processor)
    text = str(err.value)
    assert "\n" not in text and "'sdpa'" in text and "corelens" in text, text


def test_model_that_stays_on_its_attention_is_refused():
    model, processor = _user_model()
    model.set_attn_implementation = lambda *_a, **_k: None  # transformers only warns for such classes
    with pytest.raises(cl.UnsupportedModelError, match="stayed 'sdpa'"):
        _wrap(model, processor)
