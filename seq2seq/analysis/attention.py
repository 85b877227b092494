"""The attention weights of one translation, per decoder layer, and their heatmaps: what
`python -m seq2seq.visualize` draws.

Translates the sentence, runs the decoder once more on its own output asking for the attention
weights (`Transformer.decode(..., need_weights=True)` returns them per layer and site), and
keeps one map per decoder layer that runs the chosen site. Rows are the queries, columns the
keys/values, whatever the wiring, which may differ from layer to layer
(model.attention.layers); a layer where the site is skipped (model.block) has no map.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from seq2seq.config import DecodingConfig  # noqa: E402
from seq2seq.data.corpus import normalize  # noqa: E402
from seq2seq.decoding.backend import source_batch  # noqa: E402
from seq2seq.decoding.torch_backend import TorchBackend  # noqa: E402
from seq2seq.errors import ConfigError  # noqa: E402
from seq2seq.io import atomic_path  # noqa: E402
from seq2seq.model.config import Stream  # noqa: E402


def pieces(processor, ids: list[int]) -> list[str]:
    return [processor.id_to_piece(i) for i in ids]


class LayerMap(NamedTuple):
    layer: int  # 0-based decoder layer
    weights: np.ndarray  # (heads, queries, keys)
    query: list[str]  # labels of the rows
    key: list[str]  # labels of the columns


@torch.no_grad()
def attention_maps(
    backend: TorchBackend, decoding: DecodingConfig, text: str, site: str
) -> tuple[list[LayerMap], str]:
    """The weights of `site` in every decoder layer that runs it, and the translation."""
    model, tokenizer = backend.model, backend.tokenizer
    src_ids = tokenizer.encode_src([normalize(text)])[0]
    src = source_batch([src_ids])
    [[best, *_]] = backend.search(src, decoding)
    output = best.tokens
    tgt_in = torch.tensor([[tokenizer.bos_id, *output]])
    memory, src_mask = model.encode(src)
    _, weights_per_layer = model.decode(tgt_in, memory, src_mask, need_weights=True)
    labels = {
        Stream.source: [*pieces(tokenizer.src, src_ids), "</s>"],
        Stream.target: ["<s>", *pieces(tokenizer.tgt, output)],
    }
    maps = []
    for number, (layer, layer_weights) in enumerate(
        zip(model.decoder_layers, weights_per_layer, strict=True)
    ):
        attention = layer.self_attention if site == "decoder_self" else layer.cross_attention
        if attention is None:  # skipped in this layer
            continue
        weights = layer_weights[site][0]  # (h, Q, K), or (h, T, S, T) for prefix attention
        if weights.dim() == 4:
            weights = weights[:, -1]  # the whole target: the last prefix
        query, key = labels[attention.query_stream], labels[attention.key_value_stream]
        maps.append(LayerMap(number, weights.numpy(), query, key))
    if not maps:
        raise ConfigError(
            f"site={site}: this model skips it in every decoder layer (model.block); choose "
            "the other site"
        )
    return maps, tokenizer.decode_tgt([output])[0]


def plot_attention(maps: list[LayerMap], per_head: bool, title: str, output: Path) -> None:
    columns = maps[0].weights.shape[0] if per_head else 1
    panels = [
        (m, head, m.weights[head] if per_head else m.weights.mean(0))
        for m in maps
        for head in range(columns)
    ]
    size = 0.32
    width = max(4, columns * max(len(m.key) for m in maps) * size + 1.5)
    height = sum(len(m.query) * size + 1 for m in maps)
    fig, axes = plt.subplots(len(maps), columns, figsize=(width, height), squeeze=False)
    for axis, (m, head, panel) in zip(axes.flat, panels, strict=True):
        axis.imshow(panel, cmap="viridis", vmin=0, aspect="auto")
        axis.set_xticks(range(len(m.key)), m.key, rotation=90, fontsize=7)
        axis.set_yticks(range(len(m.query)), m.query, fontsize=7)
        axis.set_title(
            f"layer {m.layer + 1}" + (f", head {head + 1}" if per_head else ""), fontsize=8
        )
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    with atomic_path(output) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
