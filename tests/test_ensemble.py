"""Ensembles: the combined distribution is the mean of two different models' probabilities at
every step, with each model's own cache; a one-model ensemble is that model."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import SPECIAL_IDS, config_of

from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decoding.ensemble import Ensemble
from seq2seq.decoding.search import beam_search, max_output_len
from seq2seq.errors import ConfigError
from seq2seq.model.config import ModelConfig, Norm
from seq2seq.model.transformer import Transformer

VOCAB = 30


def model(seed: int, **overrides) -> Transformer:
    torch.manual_seed(seed)
    config = config_of(
        "model/transformer_tiny", ModelConfig, d_model=32, heads=4, ffn_dim=64, dropout=0.0
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return Transformer(config, VOCAB, VOCAB, True, **SPECIAL_IDS).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(5)
    src = torch.randint(4, VOCAB, (3, 7))
    src[:, -1] = EOS_ID
    src[2, 4:], src[2, 3] = PAD_ID, EOS_ID
    tgt = torch.randint(4, VOCAB, (3, 6))
    tgt[:, 0] = BOS_ID
    return src, tgt


@torch.no_grad()
def test_each_step_is_the_mean_of_two_different_models_probabilities() -> None:
    """Against a reference: each model's full (teacher-forced) pass, probabilities averaged."""
    first, second = model(1), model(2, norm=Norm.post)  # two different models, two wirings
    src, tgt = batch()
    reference = torch.stack([m(src, tgt).softmax(-1) for m in (first, second)]).mean(0).log()
    alone = first(src, tgt).log_softmax(-1)
    ensemble = Ensemble([first, second])
    state = ensemble.start_decoding(src)
    for t in range(tgt.shape[1]):
        step = ensemble.decode_step(state, tgt[:, t])
        torch.testing.assert_close(step, reference[:, t], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(step, alone[:, t], atol=1e-3)  # not one model's
        torch.testing.assert_close(step.exp().sum(-1), torch.ones(3), atol=1e-5, rtol=0)


@torch.no_grad()
def test_beams_reorder_every_members_cache() -> None:
    """An ensemble of a model with itself searches exactly as the model: each member's cache
    follows the beams."""
    single, src = model(1), batch()[0]
    max_len = max_output_len(src, 1.5, 4, limit=256, pad_id=PAD_ID)
    alone = beam_search(single, src, max_len, beam=3, nbest=3)
    twice = beam_search(Ensemble([single, model(1)]), src, max_len, beam=3, nbest=3)
    assert [[h.tokens for h in n] for n in twice] == [[h.tokens for h in n] for n in alone]
    for a, b in zip(alone, twice, strict=True):
        assert [h.score for h in b] == pytest.approx([h.score for h in a], abs=1e-5)
    assert math.isfinite(twice[0][0].score)


def test_models_with_other_special_ids_are_refused() -> None:
    other = model(1)
    other.eos_id = 7
    with pytest.raises(ConfigError, match="different special ids"):
        Ensemble([model(1), other])
