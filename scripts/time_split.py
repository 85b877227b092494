"""Where a running `seq2seq.train` spends its wall time, from py-spy's sampled stacks.

    py-spy record --pid PID --rate 10 --duration 180 --nonblocking --format raw --output F
    python scripts/time_split.py F

py-spy samples the live process (10 stacks a second, without stopping it), so the split is of
the real run, Lightning's loop, validation and data loading included: what a profile of a bare
step leaves out. Each sample is counted once, under the first part below whose frame it holds.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

# (part, a frame that marks it), most specific first
PARTS = [
    ("validation: greedy decoding", "greedy_search"),
    ("validation: loss and BLEU", "_EvaluationLoop"),
    ("training: loss (fused output projection + cross-entropy)", "_chunked_loss"),
    ("training: dropout masks", "_PackedDropout"),
    ("training: attention", "MultiHeadAttention"),
    ("training: feed-forward", "FeedForward"),
    ("training: other forward", "training_step"),
    ("training: backward", "backward"),
    ("training: optimizer and clipping", "optimizer_step"),
    ("data loading", "_next_data"),
    ("checkpoints", "save_checkpoint"),
]


def split(stacks: Path) -> dict[str, int]:
    """Samples per part; a raw py-spy line is 'frame;frame;... count'."""
    counts: collections.Counter[str] = collections.Counter()
    for line in stacks.read_text().splitlines():
        stack, samples = line.rsplit(" ", 1)
        part = next((name for name, frame in PARTS if frame in stack), "other")
        counts[part] += int(samples)
    return dict(counts.most_common())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stacks", type=Path, help="py-spy record --format raw output")
    counts = split(parser.parse_args().stacks)
    total = sum(counts.values())
    for part, samples in counts.items():
        print(f"{samples / total:6.1%}  {samples:6d}  {part}")
    print(f"{total} samples")


if __name__ == "__main__":
    main()
