"""A training run: Lightning's Trainer from the config, fitting, averaging and the final
checkpoint's choice, what `python -m seq2seq.train` (seq2seq/train.py) runs once started.

The run directory (Hydra's, under outputs/) receives the resolved config, the tokenizer
models, checkpoints, metrics (metrics.csv, and the files of the `logger=` choice) and the
learning curve.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import platform
import shlex
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning_fabric.utilities.rank_zero import rank_zero_only
from omegaconf import OmegaConf
from pytorch_lightning.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger, Logger

from seq2seq.concurrency import thread_budget
from seq2seq.config import RootConfig, config_to_dict
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.directions import describe_data
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.checkpoint import load_trained, read_checkpoint
from seq2seq.decoding.model_path import FINAL_CHECKPOINT
from seq2seq.errors import CheckpointError, ConfigError, TrainingError, install_hint
from seq2seq.io import atomic_path
from seq2seq.training.callbacks import (
    FlushMetricsWithCheckpoints,
    GracefulStop,
    LearningCurve,
    MovingAverage,
    ValidateAtMaxSteps,
)
from seq2seq.training.checkpoint import AtomicCheckpointIO, average_checkpoints, copy_checkpoint
from seq2seq.training.final_checkpoint import ValidationSet, choose_final, gather_candidates
from seq2seq.training.module import TranslationModule
from seq2seq.training.precision import resolve_precision

log = logging.getLogger("seq2seq.train")  # the command's log: train.log names it so

MANAGED_TRAINER_KEYS = {  # and what to do instead
    "callbacks": "remove it",
    "logger": "choose one with logger=tensorboard|wandb|mlflow|none (seq2seq/conf/logger/) instead",
    "default_root_dir": "remove it",
    "enable_checkpointing": "remove it",
    "plugins": "remove it",
}

# loggers whose package is an optional extra of seq2seq (pyproject.toml), by class name
LOGGER_EXTRAS = {"WandbLogger": "wandb", "MLFlowLogger": "mlflow"}


def trainer_arguments(config: RootConfig) -> dict:
    """The trainer group, checked against lightning's Trainer signature."""
    accepted = inspect.signature(pl.Trainer.__init__).parameters
    for key in config.trainer:
        if key in MANAGED_TRAINER_KEYS:
            raise ConfigError(
                f"config key 'trainer.{key}': set by seq2seq.train; {MANAGED_TRAINER_KEYS[key]}"
            )
        if key not in accepted:
            raise ConfigError(
                f"config key 'trainer.{key}': not an argument of lightning's Trainer "
                f"(pytorch_lightning {pl.__version__}); check its spelling"
            )
    arguments = dict(config.trainer)
    changing = [
        key
        for key, on in (
            ("data.bpe_dropout", config.data.bpe_dropout > 0),
            ("data.bidirectional_epochs", config.data.bidirectional_epochs > 0),
            ("data.mix_temperature", config.data.multilingual and config.data.mix_temperature != 1),
        )
        if on
    ]
    if changing:
        # epochs serve different numbers of batches (each segmentation its own; both
        # directions twice the pairs; a mixture at T != 1 its own draw of pairs), which
        # Lightning counts only when it makes the loaders: an epoch shorter than the count
        # would end without validating
        reload = arguments.setdefault("reload_dataloaders_every_n_epochs", 1)
        if reload != 1:
            raise ConfigError(
                f"config key 'trainer.reload_dataloaders_every_n_epochs': {reload}, and "
                f"{changing[0]} needs the training batches counted anew each epoch; "
                "remove the key or set it to 1"
            )
    return arguments


def resume_command(run_dir: Path) -> str:
    """The command line that resumes this run in its own directory."""
    overrides = []
    if HydraConfig.initialized():
        skip = ("ckpt_path=", "hydra.run.dir=")
        overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith(skip)]
    words = ["python", "-m", "seq2seq.train", *overrides, f"hydra.run.dir={run_dir}"]
    return " ".join(shlex.quote(w) for w in [*words, "ckpt_path=auto"])


def out_of_memory(error: BaseException) -> bool:
    """A CUDA out-of-memory error: the caching allocator's, or a CUDA call's
    (cudaErrorMemoryAllocation, e.g. while a graph is captured)."""
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and str(error).startswith("CUDA error: out of memory")
    )


def out_of_memory_advice(config: RootConfig, run_dir: Path, error: BaseException) -> str:
    """What to lower when training ran out of GPU memory: runs side by side share the GPU, and
    with CUDA graphs every captured batch shape keeps its own memory pool."""
    # torch's message goes on to list every process on the GPU: its first sentences say enough
    cause = str(error).split(" Process ")[0].split(" Including ")[0].splitlines()[0]
    cause = cause.strip().rstrip(".")
    lower = [f"data.max_tokens (now {config.data.max_tokens})"]
    if config.cuda_graphs:
        lower.append(
            f"cuda_graphs (now {config.cuda_graphs}; each captured batch shape keeps its own "
            "memory pool, and a higher data.pad_to_multiple, now "
            f"{config.data.pad_to_multiple}, gives fewer shapes)"
        )
    return (
        f"training ran out of GPU memory ({cause}). Lower {' or '.join(lower)}, or run fewer "
        'runs side by side on this GPU (hydra.launcher.n_jobs; docs/sweeps.md, "One GPU"). '
        "The run resumes from its last checkpoint, if it wrote one, with: "
        f"{resume_command(run_dir)}"
    )


def build_logger(config: RootConfig, run_dir: Path) -> Logger | None:
    """The `logger=` choice (conf/logger/), instantiated to write into the run directory."""
    if config.logger is None:
        return None
    target = config.logger["_target_"]
    extra = LOGGER_EXTRAS.get(target.rsplit(".", 1)[-1])
    if extra is not None:
        try:
            importlib.import_module(extra)
        except ImportError:
            raise ConfigError(
                f"config key 'logger': {target} needs the {extra} package, an optional extra: "
                f"{install_hint(extra)}; or choose logger=tensorboard or logger=none"
            ) from None
    try:
        return instantiate(config.logger, save_dir=str(run_dir))
    except InstantiationException as e:
        raise ConfigError(f"config key 'logger': {e}") from None


def build_trainer(
    config: RootConfig, run_dir: Path, logger: Logger | None, precision: str
) -> tuple[pl.Trainer, ModelCheckpoint]:
    """Lightning's Trainer from the trainer group, in `precision` (`auto` already resolved)."""
    checkpoints = run_dir / "checkpoints"
    best = ModelCheckpoint(
        dirpath=checkpoints,
        filename="best",
        monitor="val/bleu",
        mode="max",
        save_top_k=1,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )
    # last.ckpt after every epoch (Lightning's save_last refreshes it only when `best` saves,
    # and a checkpoint without a monitor saves only after validation when
    # trainer.check_val_every_n_epoch > 1)
    last = ModelCheckpoint(
        dirpath=checkpoints,
        filename="last",
        save_top_k=1,
        enable_version_counter=False,
        save_on_train_epoch_end=True,
    )
    patience = config.early_stopping_patience  # None: off
    callbacks: list[pl.Callback] = [
        best,
        last,
        *([EarlyStopping(monitor="val/bleu", mode="max", patience=patience)] if patience else []),
        LearningRateMonitor(logging_interval="step"),
        LearningCurve(run_dir),
        FlushMetricsWithCheckpoints(),
        ValidateAtMaxSteps(),
        GracefulStop(checkpoints / "last.ckpt", resume_command(run_dir)),
    ]
    if config.checkpoint_every_n_steps:
        callbacks.append(  # last.ckpt only: a mid-epoch point to resume from
            ModelCheckpoint(
                dirpath=checkpoints,
                save_top_k=0,
                save_last=True,
                every_n_train_steps=config.checkpoint_every_n_steps,
                enable_version_counter=False,
            )
        )
    if config.optim.ema_decay > 0:
        callbacks.append(MovingAverage(config.optim.ema_decay))
    if config.average_last > 0:
        callbacks.append(
            ModelCheckpoint(
                dirpath=checkpoints,
                filename="epoch{epoch:03d}",
                monitor="epoch",
                mode="max",
                save_top_k=config.average_last,
                auto_insert_metric_name=False,
                # every epoch, also between validations (trainer.check_val_every_n_epoch > 1)
                save_on_train_epoch_end=True,
            )
        )
    # metrics.csv always: the learning curve and resuming read it
    loggers: list[Logger] = [CSVLogger(run_dir, name="", version="")]
    if logger is not None:
        loggers.append(logger)
    trainer = pl.Trainer(
        # Lightning's model summary would repeat the parameter count logged at the start and
        # print "Total FLOPs: 0" (it counts FLOPs only of a module with an example input);
        # +trainer.enable_model_summary=true shows it all the same
        **{"enable_model_summary": False, **trainer_arguments(config), "precision": precision},
        callbacks=callbacks,
        logger=loggers,
        default_root_dir=run_dir,
        plugins=[AtomicCheckpointIO()],
    )
    return trainer, best


def resolve_resume(config: RootConfig, run_dir: Path) -> str | None:
    """The checkpoint to resume from; `auto` means the run directory's last.ckpt, if any."""
    if config.ckpt_path == "auto":
        last = run_dir / "checkpoints" / "last.ckpt"
        if not last.is_file():
            log.info("ckpt_path=auto: no %s yet, starting afresh", last)
            return None
        log.info("ckpt_path=auto: resuming from %s", last)
        if rank_zero_only.rank == 0 and (run_dir / "metrics.csv").is_file():
            # the CSV logger starts metrics.csv anew: keep the earlier rows beside it
            number = len(list(run_dir.glob("metrics.*.csv"))) + 1
            (run_dir / "metrics.csv").rename(run_dir / f"metrics.{number}.csv")
        return str(last)
    if config.ckpt_path is not None and not Path(config.ckpt_path).is_file():
        raise CheckpointError(
            f"cannot resume: checkpoint {config.ckpt_path} does not exist; set ckpt_path to a "
            "run's checkpoints/last.ckpt, ckpt_path=auto to resume the run directory's own, or "
            "ckpt_path=null to start afresh"
        )
    return config.ckpt_path


def describe(config: RootConfig, tokenizer: Tokenizer) -> str:
    settings = config.tokenizer
    return (
        f"{describe_data(config.data)}, "
        f"{settings.model_type} {settings.vocab_size} "
        f"{'joint' if settings.joint else 'separate'} (fingerprint "
        f"{tokenizer.fingerprint[:12]})"
    )


def check_resume_tokenizer(ckpt_path: str, config: RootConfig, tokenizer: Tokenizer) -> None:
    """A run resumes only with the vocabulary it was trained with: the embeddings depend on it.
    Only the tokenizer is compared; the model is built only to name the mismatch."""
    saved = read_checkpoint(Path(ckpt_path))["seq2seq"]
    if Tokenizer(saved["src_model"], saved["tgt_model"]).fingerprint != tokenizer.fingerprint:
        trained = load_trained(Path(ckpt_path))
        raise CheckpointError(
            "cannot resume: the checkpoint's tokenizer does not match the data config:\n"
            f"  checkpoint:  {describe(trained.config, trained.tokenizer)}\n"
            f"  data config: {describe(config, tokenizer)}\n"
            "Pass the data and tokenizer overrides of the run that wrote it (see config.yaml in "
            "its run directory), e.g. the same experiment=..."
        )


def average_last(checkpoints: Path, k: int) -> Path | None:
    """Average the last k epoch checkpoints into averaged.ckpt (None if fewer than 2)."""
    epochs = sorted(checkpoints.glob("epoch*.ckpt"))[-k:]
    if len(epochs) < 2:
        return None
    output = average_checkpoints(epochs, checkpoints / "averaged.ckpt")
    log.info("averaged %s -> %s", ", ".join(p.name for p in epochs), output)
    return output


def validation_sets(data: TranslationDataModule) -> list[ValidationSet]:
    """The pairs validation decoded (all of each validation split, or its data.val_subset
    sample), raw, for choosing the final checkpoint: one set, or one per direction."""
    sets = []
    for key in data.validation_keys():
        sources, references = data.raw_pairs(key)
        sample = data.validation_sample(key)
        if sample is not None:
            sources, references = (
                [side[i] for i in sample.indices] for side in (sources, references)
            )
        direction = data.prepared.direction[key]
        if data.multilingual:
            sets.append(ValidationSet(sources, references, direction.name, direction.tgt))
        else:
            sets.append(ValidationSet(sources, references))
    return sets


def train(config: RootConfig, run_dir: Path) -> dict | None:
    """Fit and average; return a summary naming the checkpoint to use: checkpoints/final.ckpt,
    a copy of the candidate chosen (averaged/best/last).

    Under data parallelism only the first process averages and returns a summary."""
    ckpt_path = resolve_resume(config, run_dir)
    logger = build_logger(config, run_dir)  # before any work: a missing package fails early
    torch.set_num_threads(thread_budget(config.threads))
    pl.seed_everything(config.seed, workers=True)
    data = TranslationDataModule(config, run_dir)
    data.prepare_data()
    data.setup()
    if ckpt_path is not None:
        check_resume_tokenizer(ckpt_path, config, data.tokenizer)
    module = TranslationModule(config, data.tokenizer)
    total = sum(p.numel() for p in module.model.parameters())
    log.info(
        "model %s: %.2fM parameters (%.2fM in the token embeddings and output projection)",
        config.model.name,
        total / 1e6,
        module.model.vocabulary_parameters() / 1e6,
    )
    if config.compile:
        module.model.compile_layers()
    with atomic_path(run_dir / "config.yaml") as tmp:
        tmp.write_text(OmegaConf.to_yaml(config_to_dict(config)))
    data.tokenizer.save(run_dir / "tokenizer")
    precision = resolve_precision(config.trainer)
    log.info("%s", precision)
    trainer, best = build_trainer(config, run_dir, logger, precision.precision)
    start = time.perf_counter()
    try:
        trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    except RuntimeError as e:
        if out_of_memory(e):
            raise TrainingError(out_of_memory_advice(config, run_dir, e)) from e
        raise
    seconds = time.perf_counter() - start
    if not trainer.is_global_zero:
        return None
    checkpoints = run_dir / "checkpoints"
    averaged = average_last(checkpoints, config.average_last) if config.average_last else None
    candidates = gather_candidates(
        Path(best.best_model_path) if best.best_model_path else None,
        checkpoints / "last.ckpt",
        averaged,
        config.prefer_checkpoint,
    )
    choosing = time.perf_counter()  # after the training clock: not part of trainer.max_time
    final = choose_final(
        candidates, config.prefer_checkpoint, config.decoding, validation_sets(data)
    )
    choice_seconds = time.perf_counter() - choosing
    kept = copy_checkpoint(final.path, checkpoints / FINAL_CHECKPOINT)
    log.info(
        "final checkpoint: %s, a copy of %s (%s), chosen in %.0fs",
        kept,
        final.path.name,
        final.reason,
        choice_seconds,
    )
    metrics = trainer.callback_metrics
    return {
        "variant": config.model.attention.name,
        "seed": config.seed,
        "parameters": total,
        "precision": str(trainer.precision),
        "hardware": hardware(trainer),
        "train_seconds": round(seconds, 1),
        "validation_seconds": round(module.validation_seconds, 1),
        "epochs": trainer.current_epoch,
        "steps": trainer.global_step,
        "train_loss": float(metrics["train/loss"]) if "train/loss" in metrics else None,
        "best_val_bleu": None if best.best_model_score is None else float(best.best_model_score),
        "skipped_steps": len(module.skipped_steps()),
        "final_checkpoint": str(kept),
        "final_checkpoint_choice": {
            **final.summary(),
            "path": str(final.path),
            "seconds": round(choice_seconds, 1),
        },
    }


def hardware(trainer: pl.Trainer) -> str:
    """What trained the model, in words (run_summary.json, a model card): the GPUs, or the CPU
    and the threads torch used."""
    device = trainer.strategy.root_device
    if device.type == "cuda":
        return f"{trainer.num_devices} x {torch.cuda.get_device_name(device)}"
    cpuinfo = Path("/proc/cpuinfo")
    names = [
        line.split(":", 1)[1].strip()
        for line in (cpuinfo.read_text().splitlines() if cpuinfo.is_file() else [])
        if line.startswith("model name")
    ]
    name = names[0] if names else platform.processor() or platform.machine()
    return f"{name} CPU, {torch.get_num_threads()} threads"
