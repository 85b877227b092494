"""The final-checkpoint rule: the average stays unless the best epoch is higher on validation
with paired-bootstrap p < 0.05, both scored with the run's decoding settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import config_of

from seq2seq.config import DecodingConfig
from seq2seq.training import final_checkpoint
from seq2seq.training.final_checkpoint import SIGNIFICANCE, choose_final, prefer_average

REFERENCES = [f"a dog number {i} runs across the green field" for i in range(300)]
WRONG = "the cat sleeps"


def with_errors(count: int) -> list[str]:
    """The references with the first `count` sentences translated wrong."""
    return [WRONG] * count + REFERENCES[count:]


def test_identical_outputs_keep_the_average() -> None:
    keep, p_value = prefer_average(with_errors(10), with_errors(10), REFERENCES)
    assert keep and p_value == 1.0


def test_a_clearly_better_best_epoch_replaces_the_average() -> None:
    keep, p_value = prefer_average(with_errors(60), with_errors(0), REFERENCES)
    assert not keep and p_value < SIGNIFICANCE


def test_a_small_lead_of_the_best_epoch_keeps_the_average() -> None:
    keep, p_value = prefer_average(with_errors(11), with_errors(10), REFERENCES)
    assert keep and p_value >= SIGNIFICANCE


def test_a_higher_average_stays() -> None:
    keep, _ = prefer_average(with_errors(0), with_errors(60), REFERENCES)
    assert keep


@pytest.fixture
def beam() -> DecodingConfig:
    return config_of("decoding/beam", DecodingConfig)


def test_one_candidate_is_chosen_without_decoding(beam: DecodingConfig) -> None:
    choice = choose_final({"best": Path("nowhere/best.ckpt")}, beam, ["x"], ["y"])
    assert (choice.chosen, choice.path, choice.val_bleu, choice.p_value) == (
        "best",
        Path("nowhere/best.ckpt"),
        {},
        None,
    )
    assert "no average" in choice.summary()["reason"]


@pytest.mark.parametrize(
    ("errors", "chosen"),
    [({"averaged": 60, "last": 0}, "last"), ({"averaged": 11, "last": 10}, "averaged")],
)
def test_candidates_are_decoded_with_the_run_settings_and_recorded(
    beam: DecodingConfig, monkeypatch, errors: dict[str, int], chosen: str
) -> None:
    seen = []

    def translate(ckpt: Path, decoding: DecodingConfig, sources: list[str]) -> list[str]:
        seen.append((ckpt.stem, decoding.beam_size))
        return with_errors(errors[ckpt.stem])

    monkeypatch.setattr(final_checkpoint, "translate", translate)
    candidates = {"last": Path("last.ckpt"), "averaged": Path("averaged.ckpt")}
    choice = choose_final(candidates, beam, REFERENCES, REFERENCES)
    assert sorted(seen) == [("averaged", 5), ("last", 5)]
    assert choice.chosen == chosen and choice.path == candidates[chosen]
    assert set(choice.val_bleu) == {"averaged", "last"}
    assert choice.val_bleu["last"] > choice.val_bleu["averaged"]
    assert "beam 5, length penalty 1.0" in choice.reason
