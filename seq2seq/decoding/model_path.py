"""What a command's `ckpt_path` names: a checkpoint (.ckpt), a run directory, whose model is
its `checkpoints/final.ckpt`, or a directory written by seq2seq.export (CTranslate2's).

Users name the model they trained by its run directory, the one name that holds for every
preset: which candidate the run ended with (averaged, best, last) is the final-checkpoint
rule's choice, and train copies it to final.ckpt. Runs written before final.ckpt existed
resolve through the choice their run_summary.json records.
"""

from __future__ import annotations

import json
from pathlib import Path

from seq2seq.decoding.ctranslate2_backend import FILES as EXPORT_FILES
from seq2seq.errors import CheckpointError

FINAL_CHECKPOINT = "final.ckpt"  # in a run directory's checkpoints/
RUN_SUMMARY = "run_summary.json"  # a finished run's record, written last

RUN_HOLDS = f"{RUN_SUMMARY} and checkpoints/, as seq2seq.train writes"
EXPORT_HOLDS = f"{', '.join(EXPORT_FILES)}, as seq2seq.export writes"


def is_run_directory(path: Path) -> bool:
    return (path / RUN_SUMMARY).is_file() or (path / "checkpoints").is_dir()


def is_export_directory(path: Path) -> bool:
    """Any of the export's files: a partial one is named by read_metadata's error."""
    return any((path / name).is_file() for name in EXPORT_FILES)


def resolve_model(path: str | Path) -> Path:
    """The checkpoint file or export directory that `path` names (module docstring)."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.exists():
        raise CheckpointError(
            f"ckpt_path {path} does not exist: name a run directory (outputs/<date>/"
            "<time>-<pid>, printed at the end of training), a checkpoint (.ckpt) or a directory "
            "written by python -m seq2seq.export"
        )
    if is_run_directory(path):
        return final_checkpoint(path)
    if is_export_directory(path):
        return path
    raise CheckpointError(
        f"ckpt_path {path} is a directory of neither kind: a run directory holds {RUN_HOLDS}; "
        f"an export directory holds {EXPORT_HOLDS}. Name one of those, or a .ckpt file"
    )


def model_name(path: str | Path) -> str:
    """The name a model goes by where its path is not shown: a checkpoint's or export
    directory's own, a run directory's final checkpoint's (final.ckpt)."""
    path = Path(path)
    return final_checkpoint(path).name if is_run_directory(path) else path.name


def final_checkpoint(run_dir: Path) -> Path:
    """checkpoints/final.ckpt, or for a run of an earlier version the candidate its
    run_summary.json names (looked up in this directory: the run may have been moved)."""
    final = run_dir / "checkpoints" / FINAL_CHECKPOINT
    if final.is_file():
        return final
    summary_path = run_dir / RUN_SUMMARY
    if not summary_path.is_file():
        raise CheckpointError(
            f"run directory {run_dir} has no final checkpoint: no checkpoints/{FINAL_CHECKPOINT} "
            f"and no {RUN_SUMMARY}, so the run has not finished. Resume it (python -m "
            f"seq2seq.train <its overrides> hydra.run.dir={run_dir} ckpt_path=auto), or name "
            f"one of its checkpoints, e.g. ckpt_path={run_dir}/checkpoints/last.ckpt"
        )
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{summary_path}: not valid JSON ({e}); name a checkpoint of the run instead, e.g. "
            f"ckpt_path={run_dir}/checkpoints/last.ckpt"
        ) from None
    chosen = summary.get("final_checkpoint") if isinstance(summary, dict) else None
    if not isinstance(chosen, str):
        raise CheckpointError(
            f"{summary_path} names no final_checkpoint; name a checkpoint of the run instead, "
            f"e.g. ckpt_path={run_dir}/checkpoints/last.ckpt"
        )
    candidate = run_dir / "checkpoints" / Path(chosen).name
    if not candidate.is_file():
        raise CheckpointError(
            f"{summary_path} names {Path(chosen).name} as the final checkpoint, and {candidate} "
            "does not exist; name another checkpoint of the run, e.g. "
            f"ckpt_path={run_dir}/checkpoints/last.ckpt"
        )
    return candidate
