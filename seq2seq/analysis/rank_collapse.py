"""A rank-collapse probe of every layer's output (what `python -m seq2seq.analyze` reports).

Without skip connections and feed-forward layers, a stack of self-attention layers drives its
output towards rank 1, every token the same vector (Dong et al. 2021, "Attention is not all
you need: pure attention loses rank doubly exponentially with depth"). For each layer's output
on real sentences (encoder: the source; decoder: the reference target, teacher-forced; padding
excluded), each sentence's (tokens x d_model) matrix X with singular values s gives

- the relative residual of its best rank-1 approximation, ||X - X_1||_F / ||X||_F =
  sqrt(sum_{i>1} s_i^2 / sum_i s_i^2): 0 when every token is the same vector (up to scale);
- its effective rank, exp(H(p)) with p = s / sum(s) (Roy & Vetterli 2007): 1 at collapse.

Both are averaged over sentences of at least 2 tokens. Layer 0 is the embedding.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from torch import Tensor  # noqa: E402

from seq2seq.data.batching import collate  # noqa: E402
from seq2seq.data.corpus import normalize  # noqa: E402
from seq2seq.data.tokenizer import Tokenizer  # noqa: E402
from seq2seq.io import atomic_path  # noqa: E402
from seq2seq.model.transformer import Transformer  # noqa: E402

BATCH_SENTENCES = 50
STACKS = ("encoder", "decoder")


def rank_measures(x: Tensor) -> tuple[float, float]:
    """(relative rank-1 residual, effective rank) of one sentence's (tokens, d) states."""
    s = torch.linalg.svdvals(x.double())
    energy = s.square()
    residual = math.sqrt(float(energy[1:].sum() / energy.sum()))
    p = s / s.sum()
    p = p[p > 0]
    return residual, math.exp(float(-(p * p.log()).sum()))


@torch.no_grad()
def layer_states(model: Transformer, src: Tensor, tgt_in: Tensor) -> dict[str, list[Tensor]]:
    """Per stack, the embedding and every layer's output, (B, L, d) each."""
    states: dict[str, list[Tensor]] = {
        "encoder": [model.src_embedding(src)],
        "decoder": [model.tgt_embedding(tgt_in)],
    }
    hooks = [
        layer.register_forward_hook(
            lambda _m, _i, out, stack=stack: states[stack].append(
                out[0] if isinstance(out, tuple) else out
            )
        )
        for stack in STACKS
        for layer in getattr(model, f"{stack}_layers")
    ]
    try:
        memory, src_mask = model.encode(src)
        model.decode(tgt_in, memory, src_mask)
    finally:
        for hook in hooks:
            hook.remove()
    return states


@dataclass
class LayerRow:
    model: str
    stack: str
    layer: int  # 0: the embedding
    residual: float  # mean over sentences
    effective_rank: float
    sentences: int


def probe(
    label: str, model: Transformer, tokenizer: Tokenizer, sources: list[str], targets: list[str]
) -> list[LayerRow]:
    """The rank measures of every layer of `model` on the sentence pairs, averaged."""
    model.eval()
    limit = model.config.max_len - 1
    items = [
        (i, np.asarray(s[:limit]), np.asarray(t[:limit]))
        for i, (s, t) in enumerate(
            zip(
                tokenizer.encode_src([normalize(x) for x in sources]),
                tokenizer.encode_tgt([normalize(x) for x in targets]),
                strict=True,
            )
        )
    ]
    measures: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for start in range(0, len(items), BATCH_SENTENCES):
        batch = collate(items[start : start + BATCH_SENTENCES])
        lengths = {
            "encoder": (batch.src != model.pad_id).sum(1),  # tokens + EOS
            "decoder": (batch.tgt_in != model.pad_id).sum(1),  # BOS + tokens
        }
        for stack, outputs in layer_states(model, batch.src, batch.tgt_in).items():
            for layer, output in enumerate(outputs):
                for row, length in enumerate(lengths[stack].tolist()):
                    if length >= 2:
                        values = rank_measures(output[row, :length])
                        measures.setdefault((stack, layer), []).append(values)
    return [
        LayerRow(
            label,
            stack,
            layer,
            float(np.mean([r for r, _ in values])),
            float(np.mean([e for _, e in values])),
            len(values),
        )
        for (stack, layer), values in measures.items()
    ]


def write_table(rows: list[LayerRow], output: Path) -> None:
    columns = ["model", "stack", "layer", "rank-1 residual", "effective rank", "sentences"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for r in rows:
        values = [r.model, r.stack, r.layer, f"{r.residual:.4f}", f"{r.effective_rank:.2f}"]
        lines.append("| " + " | ".join(map(str, [*values, r.sentences])) + " |")
        writer.writerow([*values, r.sentences])
    with atomic_path(output.with_suffix(".md")) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    with atomic_path(output.with_suffix(".csv")) as tmp:
        tmp.write_text(buffer.getvalue())


def plot_ranks(rows: list[LayerRow], title: str, output: Path) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), squeeze=False)
    labels = list(dict.fromkeys(r.model for r in rows))
    # one colour per variant, solid when trained, dashed at initialisation
    variants = list(dict.fromkeys(label.split()[0] for label in labels))
    for column, stack in enumerate(STACKS):
        for row, (name, measure) in enumerate(
            (("rank-1 residual", "residual"), ("effective rank", "effective_rank"))
        ):
            axis = axes[row][column]
            for label in labels:
                points = sorted(
                    (r.layer, getattr(r, measure))
                    for r in rows
                    if r.model == label and r.stack == stack
                )
                axis.plot(
                    *zip(*points, strict=True),
                    "o--" if label.endswith(" at init") else "o-",
                    color=f"C{variants.index(label.split()[0]) % 10}",
                    label=label,
                )
            axis.set_title(f"{stack}: {name}", fontsize=9)
            axis.set_xlabel("layer (0: embedding)", fontsize=8)
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
            axis.set_ylim(bottom=0)
    legend_rows = math.ceil(len(labels) / 2)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.035 * legend_rows, 1, 1))
    with atomic_path(output.with_suffix(".png")) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
