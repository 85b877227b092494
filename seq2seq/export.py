"""`python -m seq2seq.export ckpt_path=<run> export.dir=model_ct2 [export.quantization=int8]`:
a run's final checkpoint (or any .ckpt) as a CTranslate2 model directory (docs/deploy.md; the
conversion is in seq2seq.decoding.ctranslate2_backend)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from seq2seq.cli import entrypoint
from seq2seq.config import config_to_dict
from seq2seq.decoding.checkpoint import load_trained
from seq2seq.decoding.ctranslate2_backend import export_model
from seq2seq.decoding.model_path import resolve_model
from seq2seq.errors import CheckpointError

log = logging.getLogger("seq2seq.export")


@dataclass
class ExportSettings:
    dir: str
    quantization: str  # "none": float32; else one of CTranslate2's types, checked on export
    overwrite: bool


@dataclass
class ExportConfig:
    """What `export` reads (conf/export.yaml): a checkpoint and where to write its conversion."""

    ckpt_path: str
    export: ExportSettings

    def check(self) -> None:
        pass


def best_val_bleu(checkpoint: Path) -> float | None:
    """The best validation BLEU of the run a checkpoint comes from: its run_summary.json, when
    the checkpoint still sits in that run's checkpoints/ directory."""
    summary = checkpoint.parent.parent / "run_summary.json"
    if checkpoint.parent.name != "checkpoints" or not summary.is_file():
        return None
    return json.loads(summary.read_text()).get("best_val_bleu")


def export_checkpoint(
    checkpoint: Path, directory: Path, quantization: str | None = None, overwrite: bool = False
) -> Path:
    """A seq2seq checkpoint (.ckpt, or a run directory's final one) as a CTranslate2 model
    directory (see `export_model`)."""
    checkpoint = resolve_model(checkpoint)
    if checkpoint.is_dir():
        raise CheckpointError(
            f"ckpt_path {checkpoint} is an export directory already; export reads the model "
            "itself: name the run directory it came from, or a checkpoint (.ckpt)"
        )
    checkpoint = checkpoint.resolve()
    trained = load_trained(checkpoint)
    metadata = {
        "checkpoint": str(checkpoint),
        "best_val_bleu": best_val_bleu(checkpoint),
        "config": config_to_dict(trained.config),
    }
    return export_model(
        trained.model, trained.tokenizer, directory, quantization, metadata, overwrite
    )


@entrypoint(config_name="export", schema=ExportConfig)
def main(config: ExportConfig) -> None:
    settings = config.export
    quantization = None if settings.quantization == "none" else settings.quantization
    directory = export_checkpoint(
        Path(config.ckpt_path), Path(settings.dir), quantization, settings.overwrite
    )
    log.info("exported %s to %s (%s)", config.ckpt_path, directory, quantization or "float32")


if __name__ == "__main__":
    main()
