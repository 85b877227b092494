"""The final-checkpoint rule: the preferred candidate (the average, or the weights at the end)
stays unless another one is higher on validation with paired-bootstrap p < 0.05, all scored with
the run's decoding settings."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import compose_config, config_of, tiny_checkpoint

from seq2seq.config import config_to_dict
from seq2seq.decoding.config import DecodingConfig
from seq2seq.errors import ConfigError
from seq2seq.training import final_checkpoint
from seq2seq.training.final_checkpoint import (
    SIGNIFICANCE,
    ValidationSet,
    choose_final,
    decode_candidates,
    gather_candidates,
    replaces,
    same_weights,
)
from seq2seq.upgrade import load_config

REFERENCES = [f"a dog number {i} runs across the green field" for i in range(300)]
WRONG = "the cat sleeps"
VALIDATION = [ValidationSet(REFERENCES, REFERENCES)]


def with_errors(count: int) -> list[str]:
    """The references with the first `count` sentences translated wrong."""
    return [WRONG] * count + REFERENCES[count:]


def test_identical_outputs_keep_the_preferred() -> None:
    replaced, p_value = replaces([with_errors(10)], [with_errors(10)], VALIDATION)
    assert not replaced and p_value == 1.0


def test_a_clearly_better_candidate_replaces_the_preferred() -> None:
    replaced, p_value = replaces([with_errors(60)], [with_errors(0)], VALIDATION)
    assert replaced and p_value < SIGNIFICANCE


def test_a_small_lead_keeps_the_preferred() -> None:
    replaced, p_value = replaces([with_errors(11)], [with_errors(10)], VALIDATION)
    assert not replaced and p_value >= SIGNIFICANCE


def test_a_higher_preferred_stays() -> None:
    replaced, _ = replaces([with_errors(0)], [with_errors(60)], VALIDATION)
    assert not replaced


@pytest.fixture
def beam() -> DecodingConfig:
    return config_of("decoding/beam", DecodingConfig)


@pytest.fixture
def distinct_weights(monkeypatch) -> None:
    """Candidates named by path alone (`stem`), each with weights of its own."""

    def load_trained(ckpt: Path) -> SimpleNamespace:
        state = {"w": torch.tensor([ord(c) for c in ckpt.stem])}
        return SimpleNamespace(stem=ckpt.stem, model=SimpleNamespace(state_dict=lambda: state))

    monkeypatch.setattr(final_checkpoint, "load_trained", load_trained)


def test_same_weights_means_every_tensor_equal() -> None:
    state = {"model.a": torch.arange(4.0), "model.b": torch.ones(2, 2)}
    assert same_weights(state, {name: t.clone() for name, t in state.items()})
    nudged = {**state, "model.b": torch.tensor([[1.0, 1.0], [1.0, 1.0 + 1e-6]])}
    assert not same_weights(state, nudged)
    assert not same_weights(state, {"model.a": state["model.a"]})


@pytest.mark.slow
def test_candidates_with_the_same_weights_are_decoded_once(
    beam: DecodingConfig, monkeypatch, tmp_path: Path
) -> None:
    best = tiny_checkpoint(tmp_path)  # the best epoch was the last: last.ckpt, the same weights
    last = Path(shutil.copy(best, tmp_path / "last.ckpt"))
    checkpoint = torch.load(best, map_location="cpu", weights_only=True)
    first = next(name for name in checkpoint["state_dict"] if "encoder_layers" in name)
    best_sum = checkpoint["state_dict"][first].sum().item()
    checkpoint["state_dict"][first] = checkpoint["state_dict"][first] + 1e-3  # one weight moved
    averaged_sum = checkpoint["state_dict"][first].sum().item()
    averaged = tmp_path / "averaged.ckpt"
    torch.save(checkpoint, averaged)
    candidates = {"best": best, "last": last, "averaged": averaged}
    decoded = []

    def translate(trained, decoding: DecodingConfig, validation: ValidationSet) -> list[str]:
        decoded.append(trained.model.state_dict()[first.removeprefix("model.")].sum().item())
        return with_errors(10 if decoded[-1] == best_sum else 60)

    monkeypatch.setattr(final_checkpoint, "translate", translate)
    outputs, twins = decode_candidates(candidates, beam, VALIDATION)
    assert decoded == [best_sum, averaged_sum] and twins == {"last": "best"}
    assert outputs["last"] == outputs["best"] == [with_errors(10)]
    assert outputs["averaged"] == [with_errors(60)]
    decoded.clear()
    choice = choose_final(candidates, "last", beam, VALIDATION)
    assert decoded == [best_sum, averaged_sum]
    assert choice.chosen == "last" and choice.val_bleu["best"] == choice.val_bleu["last"]
    assert choice.p_values["best"] == 1.0
    assert choice.summary()["same_weights"] == {"last": "best"}


def test_one_candidate_is_chosen_without_decoding(beam: DecodingConfig) -> None:
    choice = choose_final(
        {"best": Path("nowhere/best.ckpt")}, "averaged", beam, [ValidationSet(["x"], ["y"])]
    )
    assert (choice.chosen, choice.path, choice.val_bleu, choice.p_values) == (
        "best",
        Path("nowhere/best.ckpt"),
        {},
        {},
    )
    assert "no average" in choice.summary()["reason"]
    alone = choose_final({"last": Path("last.ckpt")}, "last", beam, [ValidationSet(["x"], ["y"])])
    assert alone.chosen == "last"
    assert alone.reason == "one candidate: no validation ran and no average"


@pytest.mark.parametrize(
    ("errors", "chosen"),
    [({"averaged": 60, "last": 0}, "last"), ({"averaged": 11, "last": 10}, "averaged")],
)
def test_candidates_are_decoded_with_the_run_settings_and_recorded(
    beam: DecodingConfig, monkeypatch, distinct_weights, errors: dict[str, int], chosen: str
) -> None:
    seen = []

    def translate(trained, decoding: DecodingConfig, validation: ValidationSet) -> list[str]:
        seen.append((trained.stem, decoding.beam_size))
        return with_errors(errors[trained.stem])

    monkeypatch.setattr(final_checkpoint, "translate", translate)
    candidates = {"last": Path("last.ckpt"), "averaged": Path("averaged.ckpt")}
    choice = choose_final(candidates, "averaged", beam, VALIDATION)
    assert sorted(seen) == [("averaged", 5), ("last", 5)]
    assert choice.chosen == chosen and choice.path == candidates[chosen]
    assert set(choice.val_bleu) == {"averaged", "last"}
    assert choice.val_bleu["last"] > choice.val_bleu["averaged"]
    assert "beam 5, length penalty 1.0" in choice.reason
    assert set(choice.p_values) == {"last"} and choice.same_weights == {}


@pytest.mark.parametrize(
    ("errors", "chosen"),
    [
        ({"last": 10, "best": 11, "averaged": 11}, "last"),  # small leads: the preferred stays
        ({"last": 10, "best": 12, "averaged": 9}, "last"),  # a lead without significance
        ({"last": 60, "best": 0, "averaged": 40}, "best"),
        ({"last": 60, "best": 20, "averaged": 0}, "averaged"),  # the higher of two that beat it
    ],
)
def test_the_preferred_last_stays_unless_another_is_significantly_higher(
    beam: DecodingConfig, monkeypatch, distinct_weights, errors: dict[str, int], chosen: str
) -> None:
    def translate(trained, decoding: DecodingConfig, validation: ValidationSet) -> list[str]:
        return with_errors(errors[trained.stem])

    monkeypatch.setattr(final_checkpoint, "translate", translate)
    candidates = {name: Path(f"{name}.ckpt") for name in ("best", "last", "averaged")}
    choice = choose_final(candidates, "last", beam, VALIDATION)
    assert choice.chosen == chosen and choice.path == candidates[chosen]
    assert list(choice.p_values) == ["averaged", "best"]  # each against last
    assert choice.reason.startswith("validation BLEU, beam 5")
    summary = choice.summary()
    assert set(summary["val_bleu"]) == set(candidates)
    assert summary["chosen"] == chosen


@pytest.mark.parametrize(
    ("best", "averaged", "prefer", "names"),
    [
        (Path("best.ckpt"), Path("averaged.ckpt"), "averaged", ["best", "averaged"]),
        (Path("best.ckpt"), Path("averaged.ckpt"), "last", ["best", "last", "averaged"]),
        (Path("best.ckpt"), None, "averaged", ["best"]),
        (Path("best.ckpt"), None, "last", ["best", "last"]),
        (None, Path("averaged.ckpt"), "averaged", ["last", "averaged"]),  # no validation ran
        (None, None, "last", ["last"]),
    ],
)
def test_candidates_are_best_the_average_and_last_where_preferred_or_standing_in(
    best: Path | None, averaged: Path | None, prefer: str, names: list[str]
) -> None:
    candidates = gather_candidates(best, Path("last.ckpt"), averaged, prefer)
    assert list(candidates) == names
    assert all(path.stem == name for name, path in candidates.items())


def test_a_config_from_before_prefer_checkpoint_keeps_the_average() -> None:
    saved = config_to_dict(compose_config(["experiment=multi30k_cpu_1h_tuned"]))
    assert saved["prefer_checkpoint"] == "last"  # README's first command, since 2026-11-30
    del saved["prefer_checkpoint"]
    assert load_config(saved).prefer_checkpoint == "averaged"  # the rule these runs ended with
    with pytest.raises(ConfigError, match="config key 'prefer_checkpoint': 'best': use averaged"):
        compose_config(["prefer_checkpoint=best"])


def test_a_multilingual_model_is_chosen_on_the_mean_of_its_directions(
    beam: DecodingConfig, monkeypatch, distinct_weights
) -> None:
    """Two directions: `last` much better on one, a little worse on the other; chosen on the
    mean, each direction decoded with its own target language."""
    errors = {("last", "de"): 0, ("last", "fr"): 12, ("averaged", "de"): 60, ("averaged", "fr"): 10}
    seen = []

    def translate(trained, decoding: DecodingConfig, validation: ValidationSet) -> list[str]:
        seen.append((trained.stem, validation.target_lang))
        return with_errors(errors[trained.stem, validation.target_lang])

    monkeypatch.setattr(final_checkpoint, "translate", translate)
    sets = [ValidationSet(REFERENCES, REFERENCES, f"en-{lang}", lang) for lang in ("de", "fr")]
    candidates = {"last": Path("last.ckpt"), "averaged": Path("averaged.ckpt")}
    choice = choose_final(candidates, "averaged", beam, sets)
    assert sorted(seen) == [("averaged", "de"), ("averaged", "fr"), ("last", "de"), ("last", "fr")]
    by_direction = choice.summary()["val_bleu_by_direction"]
    for name in candidates:
        mean = (by_direction[name]["en-de"] + by_direction[name]["en-fr"]) / 2
        assert choice.val_bleu[name] == pytest.approx(mean, abs=0.01)
    assert by_direction["last"]["en-fr"] < by_direction["averaged"]["en-fr"]
    assert choice.chosen == "last" and choice.p_values["last"] < SIGNIFICANCE
    assert choice.reason.startswith("mean validation BLEU, beam 5, length penalty 1.0, fp32 of 2")
