"""`python -m seq2seq.export ckpt_path=<run> export.dir=model_ct2 [export.quantization=int8]`:
a run's final checkpoint (or any .ckpt) as a CTranslate2 model directory (docs/deploy.md; the
conversion is in seq2seq.decoding.ctranslate2_backend), or with export.format=hf as a
transformers model directory for the Hugging Face Hub (seq2seq.hub)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from seq2seq.cli import entrypoint
from seq2seq.config import config_to_dict
from seq2seq.decoding.checkpoint import load_trained
from seq2seq.decoding.ctranslate2_backend import export_model, refuse_nonempty
from seq2seq.decoding.model_path import resolve_model
from seq2seq.errors import CheckpointError, require

log = logging.getLogger("seq2seq.export")


FORMATS = ("ctranslate2", "hf")


@dataclass
class ExportSettings:
    dir: str
    format: str  # ctranslate2 | hf
    quantization: str  # "none": float32; else one of CTranslate2's types, checked on export
    overwrite: bool
    license: str  # hf: the model card's licence, a Hub licence identifier
    data_license: str | None  # hf: the training data's licence, in words, for the model card


@dataclass
class ExportConfig:
    """What `export` reads (conf/export.yaml): a checkpoint and where to write its conversion."""

    ckpt_path: str
    export: ExportSettings

    def check(self) -> None:
        settings = self.export
        require(
            settings.format in FORMATS,
            "export.format",
            f"'{settings.format}': use ctranslate2 (the default) or hf (transformers)",
        )
        require(
            settings.format == "ctranslate2" or settings.quantization == "none",
            "export.quantization",
            f"{settings.quantization}: quantization is CTranslate2's; a transformers export is "
            "float32 (leave export.quantization=none)",
        )


def best_val_bleu(checkpoint: Path) -> float | None:
    """The best validation BLEU of the run a checkpoint comes from: its run_summary.json, when
    the checkpoint still sits in that run's checkpoints/ directory."""
    run_dir = run_of(checkpoint)
    if run_dir is None:
        return None
    return json.loads((run_dir / "run_summary.json").read_text()).get("best_val_bleu")


def run_of(checkpoint: Path) -> Path | None:
    """The run directory a checkpoint still sits in (its checkpoints/ directory's parent)."""
    run_dir = checkpoint.parent.parent
    summary = run_dir / "run_summary.json"
    return run_dir if checkpoint.parent.name == "checkpoints" and summary.is_file() else None


def export_checkpoint(
    checkpoint: Path,
    directory: Path,
    quantization: str | None = None,
    overwrite: bool = False,
    format: str = "ctranslate2",
    license: str = "other",
    data_license: str | None = None,
) -> Path:
    """A seq2seq checkpoint (.ckpt, or a run directory's final one) as a CTranslate2 model
    directory (see `export_model`) or a transformers one (`export_transformers`)."""
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
    if format == "ctranslate2":
        return export_model(
            trained.model, trained.tokenizer, directory, quantization, metadata, overwrite
        )
    from seq2seq.hub.directory import export_transformers  # needs the hf extra

    refuse_nonempty(directory, overwrite)
    run_dir = run_of(checkpoint)
    summary = json.loads((run_dir / "run_summary.json").read_text()) if run_dir else None
    card = {
        "summary": summary,
        "run_dir": run_dir,
        "license": license,
        "data_license": data_license,
    }
    return export_transformers(
        trained.model, trained.tokenizer, trained.config, directory, card, metadata
    )


@entrypoint(config_name="export", schema=ExportConfig)
def main(config: ExportConfig) -> None:
    settings = config.export
    quantization = None if settings.quantization == "none" else settings.quantization
    directory = export_checkpoint(
        Path(config.ckpt_path),
        Path(settings.dir),
        quantization,
        settings.overwrite,
        settings.format,
        settings.license,
        settings.data_license,
    )
    log.info(
        "exported %s to %s (%s, %s)",
        config.ckpt_path,
        directory,
        settings.format,
        quantization or "float32",
    )


if __name__ == "__main__":
    main()
