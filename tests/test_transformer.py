"""The Transformer: causality, incremental decoding equals the full pass, padding, tying."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers import SPECIAL_IDS, config_of, random_batch

from seq2seq.data.tokenizer import PAD_ID
from seq2seq.model.config import ModelConfig, Norm, Positions
from seq2seq.model.transformer import Transformer, replace_tokens

VOCAB = 40


def tiny(**overrides) -> Transformer:
    torch.manual_seed(0)
    settings = dict(
        d_model=32, heads=4, encoder_layers=2, decoder_layers=2, ffn_dim=64, dropout=0.0
    )
    config = config_of("model/transformer_tiny", ModelConfig, **{**settings, **overrides})
    return Transformer(config, VOCAB, VOCAB, True, **SPECIAL_IDS).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return random_batch(VOCAB)


VARIANTS = [{}, {"norm": Norm.post}, {"positions": Positions.learned}]


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_position_depends_on_a_later_target_token(variant: dict) -> None:
    model = tiny(**variant)
    src, tgt = batch()
    reference = model(src, tgt)
    for t in range(tgt.shape[1] - 1):
        changed = tgt.clone()
        changed[:, t + 1 :] = torch.randint(4, VOCAB, changed[:, t + 1 :].shape)
        out = model(src, changed)
        torch.testing.assert_close(out[:, : t + 1], reference[:, : t + 1], atol=1e-5, rtol=0)
        assert not torch.allclose(out[:, t + 1 :], reference[:, t + 1 :])


@pytest.mark.parametrize("variant", VARIANTS)
def test_incremental_decoding_equals_the_full_pass(variant: dict) -> None:
    model = tiny(**variant)
    src, tgt = batch()
    full = model(src, tgt).log_softmax(-1)
    state = model.start_decoding(src)
    steps = torch.stack([model.decode_step(state, tgt[:, t]) for t in range(tgt.shape[1])], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_incremental_decoding_with_beam_rows_and_reordering() -> None:
    model = tiny()
    src, tgt = batch()
    beam = 2
    state = model.start_decoding(src, beam=beam)
    rows = tgt.repeat_interleave(beam, 0)  # (B*beam, T)
    swap = torch.arange(len(rows)).view(-1, beam).flip(1).reshape(-1)  # swap within sentences
    for t in range(3):
        model.decode_step(state, rows[:, t])
    state.reorder(swap)
    rows = rows[swap]
    last = model.decode_step(state, rows[:, 3])
    full = model(src.repeat_interleave(beam, 0), rows[:, :4]).log_softmax(-1)[:, 3]
    torch.testing.assert_close(last, full, atol=1e-5, rtol=1e-5)


def test_source_padding_changes_nothing() -> None:
    model = tiny()
    src, tgt = batch()
    padded = torch.cat([src, torch.full((3, 4), PAD_ID)], dim=1)
    torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_loss_is_summed_label_smoothed_cross_entropy_over_non_pad_targets(smoothing) -> None:
    model = tiny()
    src, tgt = batch()
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:].clone()
    tgt_out[0, 3:] = PAD_ID  # sentence 0 is shorter
    expected = F.cross_entropy(
        model(src, tgt_in).flatten(0, 1),
        tgt_out.flatten(),
        ignore_index=PAD_ID,
        label_smoothing=smoothing,
        reduction="sum",
    )
    loss = model.loss(src, tgt_in, tgt_out, smoothing)
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-5)


def test_static_shape_loss_of_a_padded_batch_equals_the_loss_of_the_unpadded_one() -> None:
    """What CUDA graphs train on (training/cuda_graphs.py): every position scored, padding
    weighted 0, and the batch padded further than its longest pair: the same loss and the
    same gradient of every parameter as the selected positions of the unpadded batch."""
    model = tiny()
    src, tgt = batch()
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:].clone()
    tgt_out[0, 3:] = PAD_ID  # sentence 0 is shorter

    def loss_and_grads(*inputs: torch.Tensor, static: bool) -> tuple[torch.Tensor, ...]:
        loss = model.loss(*inputs, 0.1, static_shapes=static)
        return loss, *torch.autograd.grad(loss, list(model.parameters()))

    def pad(x: torch.Tensor, columns: int) -> torch.Tensor:
        return torch.cat([x, torch.full((x.shape[0], columns), PAD_ID)], dim=1)

    model.eval()  # dropout masks follow the shape: compare without them
    expected = loss_and_grads(src, tgt_in, tgt_out, static=False)
    static = loss_and_grads(src, tgt_in, tgt_out, static=True)
    padded = loss_and_grads(pad(src, 5), pad(tgt_in, 3), pad(tgt_out, 3), static=True)
    for got in (static, padded):
        for g, want in zip(got, expected, strict=True):
            torch.testing.assert_close(g, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("static", [False, True])
def test_r_drop_loss_is_r_drops_loss_of_the_batch_run_twice_with_its_own_masks(
    static: bool,
) -> None:
    """In training, the two passes are the batch repeated as 2B pairs in one forward (so each
    copy draws its own dropout masks): the loss equals R-Drop's on the logits of that forward,
    drawn from the same seed, and the passes differ."""
    model = tiny(dropout=0.3).train()
    src, tgt = batch()
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:].clone()
    tgt_out[0, 3:] = PAD_ID  # sentence 0 is shorter
    torch.manual_seed(5)
    loss = model.loss(src, tgt_in, tgt_out, 0.1, static_shapes=static, r_drop=2.0)
    torch.manual_seed(5)
    log_p = model(src.repeat(2, 1), tgt_in.repeat(2, 1)).log_softmax(-1).unflatten(0, (2, 3))
    scored = tgt_out != PAD_ID
    ce = [
        F.cross_entropy(log_p[k][scored], tgt_out[scored], label_smoothing=0.1, reduction="sum")
        for k in range(2)
    ]
    p = log_p.exp()
    kl = ((p[0] - p[1]) * (log_p[0] - log_p[1])).sum(-1)[scored].sum()
    assert kl > 0.01  # the two copies drew different masks
    torch.testing.assert_close(loss, (ce[0] + ce[1]) / 2 + 2.0 / 4 * kl, atol=1e-4, rtol=1e-5)


def test_r_drop_without_dropout_gives_the_plain_loss_and_gradients() -> None:
    model = tiny()  # eval(), dropout 0: the two passes are equal, the penalty 0
    src, tgt = batch()
    inputs = (src, tgt[:, :-1], tgt[:, 1:])

    def loss_and_grads(**r_drop: float) -> tuple[torch.Tensor, ...]:
        loss = model.loss(*inputs, 0.1, **r_drop)
        return loss, *torch.autograd.grad(loss, list(model.parameters()))

    for got, want in zip(loss_and_grads(r_drop=1.0), loss_and_grads(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_embeddings_are_tied_three_ways_only_for_a_joint_vocabulary() -> None:
    model = tiny()
    shared = model.tgt_embedding.tokens.weight
    assert model.src_embedding.tokens.weight is shared
    assert model.output_projection.weight is shared
    separate = Transformer(tiny().config, VOCAB, VOCAB + 5, False, **SPECIAL_IDS)
    assert separate.src_embedding.tokens.weight is not separate.tgt_embedding.tokens.weight
    assert separate.output_projection.weight is separate.tgt_embedding.tokens.weight
    untied = Transformer(replace(tiny().config, tie_embeddings=False), 9, 9, True, **SPECIAL_IDS)
    assert untied.output_projection.weight is not untied.tgt_embedding.tokens.weight
    d = tiny().config.d_model
    assert model.vocabulary_parameters() == VOCAB * d  # one tensor, counted once
    assert separate.vocabulary_parameters() == (VOCAB + VOCAB + 5) * d
    assert untied.vocabulary_parameters() == 3 * 9 * d  # nothing tied


def test_parameter_count_matches_the_architecture() -> None:
    d, f, layers, v = 512, 2048, 6, 37000  # the paper's base model, shared 37k vocabulary
    model = Transformer(
        config_of("model/transformer_base", ModelConfig, d_model=d, ffn_dim=f),
        v,
        v,
        True,
        **SPECIAL_IDS,
    )
    attention = 4 * d * d + 4 * d
    feed_forward = 2 * d * f + d + f
    norm = 2 * d
    expected = (
        v * d  # one tied embedding
        + layers * (attention + feed_forward + 2 * norm)
        + layers * (2 * attention + feed_forward + 3 * norm)
        + 2 * norm  # final norms of pre-LN
    )
    assert sum(p.numel() for p in model.parameters()) == expected  # about 63M; the paper: 65M


def test_token_replacement_keeps_specials_and_draws_ordinary_tokens() -> None:
    first = max(SPECIAL_IDS.values()) + 1
    ids = torch.randint(first, VOCAB, (200, 50))
    ids[:, 0], ids[:, -1], ids[:, -10:-1] = SPECIAL_IDS["bos_id"], SPECIAL_IDS["eos_id"], PAD_ID
    torch.manual_seed(0)
    replaced = replace_tokens(ids, 0.25, first, VOCAB)
    assert torch.equal(replaced[:, [0, *range(-10, 0)]], ids[:, [0, *range(-10, 0)]])
    changed = (replaced != ids)[:, 1:-10].double().mean().item()
    # a replacement draws the token it replaces once in VOCAB - first times
    expected = 0.25 * (1 - 1 / (VOCAB - first))
    assert abs(changed - expected) < 0.01
    assert replaced.min() >= 0 and replaced[:, 1:-10].min() >= first and replaced.max() < VOCAB


def test_token_replacement_acts_in_training_only() -> None:
    model = tiny(token_replacement=0.5)
    src, tgt = batch()
    torch.manual_seed(1)
    clean = tiny()(src, tgt)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), clean)  # eval(): no replacement
        model.train()
        torch.manual_seed(1)
        noisy = model(src, tgt)
        torch.manual_seed(1)
        assert torch.equal(model(src, tgt), noisy)  # drawn from torch's seed
    assert not torch.allclose(noisy, clean)
