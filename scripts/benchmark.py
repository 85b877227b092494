"""Training and decoding speed of our Transformer against Hugging Face's MarianMTModel.

    python scripts/benchmark.py [--quick] [--json FILE] [config overrides ...]
    python scripts/benchmark.py paths.data_dir=../shared/data

Both models are built in this one process from the same config (model shape, vocabulary, tied
embeddings), see the same real batches from our data module and run on the same threads.
Repetitions are interleaved (ours, Marian, ours, ...) because the machine is shared and noisy:
the tables give medians and the ratio ours / Marian of the same repetitions.

- Training: target tokens/s of forward + backward + clipping + AdamW step (the optimizer of
  `seq2seq.train`, for both models), fp32 and bf16 autocast (CPU), bf16 autocast on a GPU.
  Marian's loss is label-smoothed F.cross_entropy over its logits, what a Hugging Face user
  would write.
- Decoding: sentences/s on test sources in batches of `decoding.batch_size`, greedy and beam.
  Lengths are forced equal: every hypothesis has exactly `--length` tokens, then EOS (ours:
  EOS masked before that step and forced at it; Marian: min_new_tokens=length,
  max_new_tokens=length + 1), so both run length + 1 decoder steps per sentence.
- The CPU's matmul peak (best of square matmuls) and the achieved GFLOP/s of our training
  step (FLOPs counted by torch's FlopCounterMode: matmuls and attention), i.e. the MFU.
- Peak memory: resident set size sampled during each phase (CPU), max allocated (GPU).

Timings are reported, never asserted: CI runs `--quick` for its output only.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from seq2seq.config import RootConfig, validate_config
from seq2seq.data.batching import Batch, TokenBudgetBatchSampler, collate
from seq2seq.data.datamodule import prepare
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.io import atomic_path
from seq2seq.model.transformer import Transformer
from seq2seq.module import TranslationModule, adamw
from seq2seq.search import beam_search, greedy_search

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Settings:
    train_batches: int
    cpu_bf16_batches: int  # bf16 autocast without bf16 units runs ~10x slower: time fewer
    reps: int
    sentences: int  # test sources to decode
    length: int  # forced output tokens per hypothesis
    matmul_size: int


FULL = Settings(
    train_batches=10, cpu_bf16_batches=1, reps=3, sentences=1000, length=40, matmul_size=2048
)
QUICK = Settings(
    train_batches=2, cpu_bf16_batches=1, reps=1, sentences=128, length=10, matmul_size=512
)


def load_config(overrides: list[str]) -> RootConfig:
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return validate_config(compose("train", overrides))


# --- measuring -------------------------------------------------------------------------------


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def peak_memory(device: torch.device, record: list[int]) -> Iterator[None]:
    """Append the phase's peak: max allocated on a GPU, else resident set size (sampled)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        yield
        record.append(torch.cuda.max_memory_allocated(device))
        return
    peak, done = [resident_bytes()], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], resident_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
        record.append(max(peak[0], resident_bytes()))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(dtype: torch.dtype, n: int, device: torch.device, tries: int = 5) -> float:
    """Best GFLOP/s of an n x n x n matmul: what this device can do at all."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(tries):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


# --- the two systems -------------------------------------------------------------------------


def marian_like(config: RootConfig, vocab: int) -> nn.Module:
    """MarianMTModel of our model's shape: same widths, depths, heads, vocabulary, ties."""
    from transformers import MarianConfig, MarianMTModel

    m = config.model
    return MarianMTModel(
        MarianConfig(
            vocab_size=vocab,
            decoder_vocab_size=vocab,
            d_model=m.d_model,
            encoder_layers=m.encoder_layers,
            decoder_layers=m.decoder_layers,
            encoder_attention_heads=m.heads,
            decoder_attention_heads=m.heads,
            encoder_ffn_dim=m.ffn_dim,
            decoder_ffn_dim=m.ffn_dim,
            activation_function="relu",
            dropout=m.dropout,
            attention_dropout=m.attention_dropout,
            activation_dropout=m.activation_dropout,
            max_position_embeddings=m.max_len,
            scale_embedding=True,
            share_encoder_decoder_embeddings=True,
            tie_word_embeddings=m.tie_embeddings,
            pad_token_id=PAD_ID,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            decoder_start_token_id=BOS_ID,
            forced_eos_token_id=None,
        )
    )


def clip_and_step(model: nn.Module, optimizer: torch.optim.Optimizer, clip: float) -> None:
    nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def our_train_step(
    module: TranslationModule, config: RootConfig, mixed: bool
) -> Callable[[Batch], None]:
    optimizer = adamw(module.parameters(), config.optim, mixed_precision=mixed)
    clip = config.trainer.get("gradient_clip_val") or float("inf")

    def step(batch: Batch) -> None:
        loss, _ = module.loss(batch)
        loss.backward()
        clip_and_step(module, optimizer, clip)

    return step


def marian_train_step(model: nn.Module, config: RootConfig, mixed: bool) -> Callable[[Batch], None]:
    optimizer = adamw(model.parameters(), config.optim, mixed_precision=mixed)
    clip = config.trainer.get("gradient_clip_val") or float("inf")
    smoothing = config.optim.label_smoothing

    def step(batch: Batch) -> None:
        logits = model(
            input_ids=batch.src,
            attention_mask=batch.src != PAD_ID,
            decoder_input_ids=batch.tgt_in,
        ).logits
        loss = F.cross_entropy(
            logits.flatten(0, 1),
            batch.tgt_out.flatten(),
            ignore_index=PAD_ID,
            label_smoothing=smoothing,
        )
        loss.backward()
        clip_and_step(model, optimizer, clip)

    return step


class FixedLength:
    """Our decoder with EOS masked before `length` tokens, so every hypothesis has that length
    (the search itself forces EOS at its `max_len`)."""

    def __init__(self, model: Transformer, length: int) -> None:
        self.model, self.length = model, length
        self.pad_id, self.bos_id, self.eos_id = model.pad_id, model.bos_id, model.eos_id

    def start_decoding(self, src: Tensor, beam: int = 1):
        return self.model.start_decoding(src, beam)

    def decode_step(self, state, tokens: Tensor) -> Tensor:
        log_probs = self.model.decode_step(state, tokens)
        if state.position <= self.length:  # this was step position - 1 < length
            log_probs[:, EOS_ID] = float("-inf")
        return log_probs


@torch.no_grad()
def greedy_without_cache(model: Transformer, src: Tensor, length: int) -> list[list[int]]:
    """Greedy search that reruns the decoder over the whole prefix at every step."""
    memory, src_mask = model.encode(src)
    prefix = torch.full((src.shape[0], 1), BOS_ID, dtype=torch.long, device=src.device)
    for t in range(length + 1):
        states, _ = model.decode(prefix, memory, src_mask)  # (B, t + 1, d)
        log_probs = model.output_projection(states[:, -1]).log_softmax(dim=-1)
        log_probs[:, [PAD_ID, BOS_ID]] = float("-inf")
        if t < length:
            log_probs[:, EOS_ID] = float("-inf")
        else:
            log_probs[:, :EOS_ID] = float("-inf")
            log_probs[:, EOS_ID + 1 :] = float("-inf")
        prefix = torch.cat([prefix, log_probs.argmax(dim=-1, keepdim=True)], dim=1)
    return prefix[:, 1:-1].tolist()


# --- phases ----------------------------------------------------------------------------------


@dataclass
class Measured:
    seconds: list[float]
    work: float  # tokens or sentences per repetition
    memory: list[int]

    def rates(self) -> list[float]:
        return [self.work / s for s in self.seconds]

    def median(self) -> float:
        return statistics.median(self.rates())


def interleaved(
    phases: dict[str, Callable[[], float]], reps: int, device: torch.device
) -> dict[str, Measured]:
    """Run each phase once to warm up, then `reps` rounds of all phases in turn."""
    results = {}
    for name, run in phases.items():
        results[name] = Measured([], run(), [])
    for _ in range(reps):
        for name, run in phases.items():
            synchronize(device)
            with peak_memory(device, results[name].memory):
                start = time.perf_counter()
                run()
                synchronize(device)
                results[name].seconds.append(time.perf_counter() - start)
    return results


def training_phase(
    step: Callable[[Batch], None], batches: list[Batch], autocast: torch.dtype | None
) -> Callable[[], float]:
    device = batches[0].src.device

    def run() -> float:
        enabled = autocast is not None
        with torch.autocast(device.type, dtype=autocast, enabled=enabled):
            for batch in batches:
                step(batch)
        return float(sum(b.tgt_tokens for b in batches))

    return run


def training_flops(module: TranslationModule, batches: list[Batch]) -> int:
    """FLOPs of forward + backward over `batches` (the optimizer step is not counted)."""
    counter = FlopCounterMode(display=False)
    with counter:
        for batch in batches:
            module.loss(batch)[0].backward()
    module.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def decoding_phase(search: Callable[[Tensor], list[list[int]]], sources: list[Tensor]):
    def run() -> float:
        for src in sources:
            search(src)
        return float(sum(s.shape[0] for s in sources))

    return run


# --- report ----------------------------------------------------------------------------------


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu} ({os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}){gpu}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def mib(values: list[int]) -> str:
    return f"{max(values) / 2**20:,.0f}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (CI: output only)")
    parser.add_argument("--json", type=Path, help="also write all measurements to this file")
    parser.add_argument("--length", type=int, help="forced output tokens per hypothesis")
    parser.add_argument(
        "--compile", action="store_true", help="also train a torch.compile'd copy of our model"
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, as for seq2seq.train")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    length = args.length or settings.length

    config = load_config(args.overrides)
    torch.manual_seed(config.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    prepared = prepare(config)
    tokenizer = prepared.tokenizer
    train = prepared.splits[config.data.train_split]
    sampler = TokenBudgetBatchSampler(
        train.src_lens, train.tgt_lens, config.data.max_tokens, shuffle=True, seed=config.seed
    )
    batches = [
        Batch(*(t.to(device) for t in collate([train[i] for i in indices])))
        for indices in sampler.batches()[: settings.train_batches]
    ]
    test = prepared.splits[config.data.test_sets[0]]
    order = sorted(range(min(settings.sentences, len(test))), key=lambda i: len(test[i][1]))
    size = config.decoding.batch_size
    sources = [
        collate([test[i] for i in order[start : start + size]]).src.to(device)
        for start in range(0, len(order), size)
    ]

    module = TranslationModule(config, tokenizer).to(device)
    try:
        marian = marian_like(config, tokenizer.tgt_vocab_size).to(device)
        marian_note = ""
    except ImportError:
        marian, marian_note = None, "transformers is not installed: pip install -e '.[bench]'"
    vocab_ok = tokenizer.joint and tokenizer.src_vocab_size == tokenizer.tgt_vocab_size
    if marian is not None and not vocab_ok:
        marian, marian_note = None, "Marian comparison needs a joint vocabulary"
    precisions: dict[str, torch.dtype | None] = {"fp32": None, "bf16 autocast": torch.bfloat16}
    if device.type == "cuda":
        precisions = {"bf16-mixed": torch.bfloat16}

    # training
    module.train()
    builders = {"ours": lambda mixed: our_train_step(module, config, mixed)}
    if args.compile:
        compiled = copy.deepcopy(module)
        compiled.model.compile_layers()
        builders["ours compiled"] = lambda mixed: our_train_step(compiled, config, mixed)
    if marian is not None:
        marian.train()
        builders["marian"] = lambda mixed: marian_train_step(marian, config, mixed)
    timed = {
        precision: batches[: settings.cpu_bf16_batches] if slow else batches
        for precision, dtype in precisions.items()
        for slow in [dtype is not None and device.type == "cpu"]
    }
    phases = {
        f"{system} {precision}": training_phase(build(dtype is not None), timed[precision], dtype)
        for precision, dtype in precisions.items()
        for system, build in builders.items()
    }
    trained = interleaved(phases, settings.reps, device)
    flops_per_pass = {precision: training_flops(module, b) for precision, b in timed.items()}

    # decoding
    module.eval()
    model = module.model
    fixed = FixedLength(model, length)
    beam, penalty = config.decoding.beam_size, config.decoding.length_penalty

    def budget(src: Tensor) -> Tensor:
        return torch.full((src.shape[0],), length, device=device)

    def generate(src: Tensor, beams: int) -> list[list[int]]:
        return marian.generate(
            input_ids=src,
            attention_mask=src != PAD_ID,
            num_beams=beams,
            length_penalty=penalty,
            min_new_tokens=length,
            max_new_tokens=length + 1,
            do_sample=False,
        ).tolist()

    searches = {
        "ours greedy": lambda src: greedy_search(fixed, src, budget(src)),
        "ours greedy, no cache": lambda src: greedy_without_cache(model, src, length),
        f"ours beam {beam}": lambda src: beam_search(fixed, src, budget(src), beam, penalty),
    }
    if marian is not None:
        marian.eval()
        searches["marian greedy"] = lambda src: generate(src, 1)
        searches[f"marian beam {beam}"] = lambda src: generate(src, beam)
    with torch.inference_mode():
        cached = greedy_search(fixed, sources[0], budget(sources[0]))
        uncached = greedy_without_cache(model, sources[0], length)
        decoded = interleaved(
            {name: decoding_phase(s, sources) for name, s in searches.items()},
            settings.reps,
            device,
        )

    # report
    peaks = {
        name: matmul_peak(dtype or torch.float32, settings.matmul_size, device)
        for name, dtype in precisions.items()
    }
    command = "python scripts/benchmark.py " + " ".join(argv)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results = {
        "command": command,
        "date": now,
        "machine": machine(),
        "torch": torch.__version__,
        "transformers": transformers_version(),
        "parameters": {
            "ours": sum(p.numel() for p in module.parameters()),
            "marian": sum(p.numel() for p in marian.parameters()) if marian else None,
        },
        "batches": {precision: len(b) for precision, b in timed.items()},
        "target_tokens": {
            precision: sum(x.tgt_tokens for x in b) for precision, b in timed.items()
        },
        "sentences": sum(s.shape[0] for s in sources),
        "length": length,
        "matmul_peak_gflops": peaks,
        "training": {k: vars(v) for k, v in trained.items()},
        "training_flops": flops_per_pass,
        "decoding": {k: vars(v) for k, v in decoded.items()},
        "cache_equals_no_cache": cached == uncached,
    }
    print(report(results, trained, decoded, precisions, beam, marian_note))
    if args.json:
        with atomic_path(args.json) as tmp:
            tmp.write_text(json.dumps(results, indent=2))
    return 0


def transformers_version() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def ratio(a: Measured, b: Measured) -> str:
    """Median over repetitions of a's rate / b's rate (same round, same conditions)."""
    pairs = [x / y for x, y in zip(a.rates(), b.rates(), strict=True)]
    return f"{statistics.median(pairs):.2f}x"


def report(
    results: dict,
    trained: dict[str, Measured],
    decoded: dict[str, Measured],
    precisions: dict[str, torch.dtype | None],
    beam: int,
    marian_note: str,
) -> str:
    params = results["parameters"]
    lines = [
        f"command: `{results['command']}`",
        f"date: {results['date']}; machine: {results['machine']}",
        f"torch {results['torch']}, transformers {results['transformers']}",
        f"parameters: ours {params['ours']:,}, Marian {params['marian'] or 0:,}",
        "training, a pass: "
        + ", ".join(
            f"{precision} {n} Multi30k batches ({results['target_tokens'][precision]:,} target "
            "tokens)"
            for precision, n in results["batches"].items()
        ),
        f"decoding: {results['sentences']} test sources, {results['length']} tokens + EOS each",
        "matmul peak: "
        + ", ".join(f"{k} {v:,.1f} GFLOP/s" for k, v in results["matmul_peak_gflops"].items()),
    ]
    if marian_note:
        lines.append(f"Marian rows skipped: {marian_note}")
    rows = []
    for precision in precisions:
        marian = trained.get(f"marian {precision}")
        peak = results["matmul_peak_gflops"][precision]
        for name, m in trained.items():
            if not name.endswith(f" {precision}"):
                continue
            is_ours = name.startswith("ours")
            flops = results["training_flops"][precision]
            achieved = flops / statistics.median(m.seconds) / 1e9
            rows.append(
                [
                    name,
                    f"{m.median():,.0f}",
                    f"{min(m.rates()):,.0f}-{max(m.rates()):,.0f}",
                    ratio(m, marian) if is_ours and marian else "",
                    f"{achieved:,.1f} ({achieved / peak:.0%})" if is_ours else "",
                    mib(m.memory),
                ]
            )
    header = ["training", "target tok/s (median)", "range", "ours / Marian", "GFLOP/s (MFU)"]
    lines += ["", table([*header, "peak MiB"], rows), ""]
    rows = []
    reference = {
        "ours greedy": decoded.get("marian greedy"),
        f"ours beam {beam}": decoded.get(f"marian beam {beam}"),
    }
    for name, m in decoded.items():
        against = ""
        if reference.get(name) is not None:
            against = f"{ratio(m, reference[name])} Marian's"
        if name == "ours greedy":
            against += f"; {ratio(m, decoded['ours greedy, no cache'])} no cache"
        rows.append([name, f"{m.median():,.1f}", against.lstrip("; "), mib(m.memory)])
    lines.append(table(["decoding", "sentences/s (median)", "ours /", "peak MiB"], rows))
    same = "yes" if results["cache_equals_no_cache"] else "NO"
    lines.append(f"\ngreedy with cache gives the no-cache outputs (first batch): {same}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
