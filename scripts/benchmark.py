"""Training and decoding speed of our Transformer against Hugging Face's MarianMTModel.

    python scripts/benchmark.py [--quick] [--json FILE] [--compile] [--cuda-graphs] [overrides ...]
    python scripts/benchmark.py paths.data_dir=../shared/data

Both models are built in this one process from the same config (model shape, vocabulary, tied
embeddings), see the same real batches from our data module and run on the same threads.
Repetitions are interleaved (ours, Marian, ours, ...) because the machine is shared and noisy:
the tables give medians and the ratio ours / Marian of the same repetitions.

- Training: target tokens/s of forward + backward + clipping + AdamW step (the optimizer of
  `seq2seq.train`, for both models), fp32 and bf16 autocast (CPU), bf16 autocast on a GPU.
  Marian's loss is label-smoothed F.cross_entropy over its logits, what a Hugging Face user
  would write.
- Decoding: sentences/s on test sources in batches of `decoding.batch_size`, greedy and beam,
  ours, Marian's `generate` and CTranslate2 (float32 and int8) with our weights converted by
  seq2seq.export. Lengths are forced equal: every hypothesis has exactly `--length` tokens,
  then EOS (ours: EOS masked before that step and forced at it; Marian: min_new_tokens=length,
  max_new_tokens=length + 1; CTranslate2: min/max_decoding_length), so all run length + 1
  decoder steps per sentence.
- The CPU's matmul peak (best of square matmuls) and the achieved GFLOP/s of our training
  step (FLOPs counted by torch's FlopCounterMode: matmuls and attention), i.e. the MFU.
- Peak memory: resident set size sampled during each phase (CPU), max allocated (GPU).

Timings are reported, never asserted: CI runs `--quick` for its output only.
This file wires the phases; each lives in a module of scripts/bench/.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from bench.data import load_config, load_workload
from bench.decoding import (
    cache_equals_no_cache,
    marian_searches,
    our_searches,
    same_greedy_rows,
    time_decoding,
)
from bench.deployed import ctranslate2_searches
from bench.flops import matmul_peak, training_flops
from bench.models import (
    build_marian,
    build_ours,
    compiled_copy,
    graphed_copy,
    parameters,
    transformer,
)
from bench.report import environment, report, write_json
from bench.training import precisions, time_training, timed_batches


@dataclass
class Settings:
    train_batches: int
    cpu_bf16_batches: int  # bf16 autocast on a CPU without bf16 units is slow: time fewer
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


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (CI: output only)")
    parser.add_argument("--json", type=Path, help="also write all measurements to this file")
    parser.add_argument("--length", type=int, help="forced output tokens per hypothesis")
    parser.add_argument(
        "--compile", action="store_true", help="also train a torch.compile'd copy of our model"
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="also train a copy of our model through CUDA graphs (a GPU only)",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, as for seq2seq.train")
    args = parser.parse_args(argv)
    if args.cuda_graphs and not torch.cuda.is_available():
        parser.error("--cuda-graphs needs a CUDA GPU, and torch sees none")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    length = args.length or settings.length
    config = load_config(args.overrides)
    torch.manual_seed(config.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    work = load_workload(config, device, settings.train_batches, settings.sentences)

    ours = build_ours(config, work.tokenizer, device)
    marian, marian_note = build_marian(config, work.tokenizer, device)
    systems = {"ours": ours}
    if args.compile:
        systems["ours compiled"] = compiled_copy(ours)
    if args.cuda_graphs:
        systems["ours graphed"] = graphed_copy(ours, config)
    if marian is not None:
        systems["marian"] = marian

    modes = precisions(device)
    timed = timed_batches(work.batches, modes, device, settings.cpu_bf16_batches)
    trained = time_training(systems, timed, modes, config, settings.reps, device)
    flops = {precision: training_flops(ours, batches) for precision, batches in timed.items()}

    beam, penalty = config.decoding.beam_size, config.decoding.length_penalty
    searches = our_searches(transformer(ours), length, beam, penalty)
    if marian is not None:
        searches |= marian_searches(marian.model, length, beam, penalty)
    deployed, ctranslate2_note = ctranslate2_searches(
        transformer(ours), work.tokenizer, length, beam, penalty
    )
    same = cache_equals_no_cache(searches, work.sources[0])
    same_as_ctranslate2 = same_greedy_rows(searches, deployed, work.tokenizer, work.sources[0])
    decoded = time_decoding(searches, deployed, work.sources, settings.reps, device)

    peaks = {
        name: matmul_peak(dtype or torch.float32, settings.matmul_size, device)
        for name, dtype in modes.items()
    }
    results = {
        **environment("benchmark.py", argv),
        "parameters": {"ours": parameters(ours), "marian": parameters(marian)},
        "batches": {precision: len(b) for precision, b in timed.items()},
        "target_tokens": {
            precision: sum(x.tgt_tokens for x in b) for precision, b in timed.items()
        },
        "sentences": sum(s.shape[0] for s in work.sources),
        "length": length,
        "matmul_peak_gflops": peaks,
        "training": {k: vars(v) for k, v in trained.items()},
        "training_flops": flops,
        "decoding": {k: vars(v) for k, v in decoded.items()},
        "cache_equals_no_cache": same,
        "greedy_rows_as_ctranslate2": same_as_ctranslate2,
    }
    notes = {"Marian": marian_note, "CTranslate2": ctranslate2_note}
    print(report(results, trained, decoded, modes, beam, notes))
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
