"""`python -m seq2seq.visualize ckpt_path=... text="..."`: attention heatmaps of one sentence,
one panel per layer (the mean over heads, or one per head) of the chosen site: cross,
decoder_self or encoder_self (seq2seq.analysis.attention)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seq2seq.analysis.attention import attention_maps, plot_attention
from seq2seq.cli import entrypoint
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.model_path import resolve_model
from seq2seq.decoding.torch_backend import TorchBackend
from seq2seq.errors import require
from seq2seq.model.config import SITES


@dataclass
class VisualizeConfig:
    """What `visualize` reads (conf/visualize.yaml)."""

    ckpt_path: str
    text: str
    site: str  # cross | decoder_self | encoder_self
    per_head: bool  # one panel per head instead of the mean over heads
    output: str | None  # default: <checkpoint>.<site>.png beside the checkpoint
    decoding: DecodingConfig

    def check(self) -> None:
        self.decoding.check()
        require(self.site in SITES, "site", f"'{self.site}': use {', '.join(SITES)}")


@entrypoint(config_name="visualize", schema=VisualizeConfig)
def main(config: VisualizeConfig) -> None:
    ckpt = resolve_model(config.ckpt_path)
    backend = TorchBackend.from_checkpoint(ckpt)
    maps, translation = attention_maps(backend, config.decoding, config.text, config.site)
    training = backend.training_config
    output = (
        Path(config.output) if config.output else ckpt.with_name(f"{ckpt.stem}.{config.site}.png")
    )
    wiring = getattr(training.model.attention, config.site)
    title = (
        f"{config.site} ({training.model.attention.name}: Q={wiring.query}, "
        f"K/V={wiring.key_value}, {wiring.score})\n{config.text} -> {translation}"
    )
    plot_attention(maps, config.per_head, title, output)
    print(output)


if __name__ == "__main__":
    main()
