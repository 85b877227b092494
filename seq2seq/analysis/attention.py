"""The attention weights of one translation at every site, layer and head: what
`python -m seq2seq.visualize` draws and what the server's page (seq2seq.serving) shows.

The sentence is translated, then the model runs once more, teacher-forced on its own output,
asking for the weights (`Transformer.encode(..., weights=[...])` and
`Transformer.decode(..., need_weights=True)`). Rows are the queries, columns the keys/values,
whatever the wiring, which may differ from layer to layer (model.attention.layers); a layer
where a site is skipped (model.block) has no map. A decoder site whose queries come from the
source has one map per target prefix (its result at target position t only sees the target up
to t): (heads, T, S, T) where the others are (heads, Q, K).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from seq2seq.data.tokenizer import Tokenizer  # noqa: E402
from seq2seq.decoding.backend import source_batch  # noqa: E402
from seq2seq.decoding.config import DecodingConfig  # noqa: E402
from seq2seq.decoding.torch_backend import TorchBackend  # noqa: E402
from seq2seq.decoding.translator import Translator  # noqa: E402
from seq2seq.errors import ConfigError, require  # noqa: E402
from seq2seq.io import atomic_path  # noqa: E402
from seq2seq.model.config import SITES, Stream  # noqa: E402
from seq2seq.model.transformer import Transformer  # noqa: E402


def pieces(processor, ids: list[int]) -> list[str]:
    return [processor.id_to_piece(i) for i in ids]


class SiteMap(NamedTuple):
    site: str  # encoder_self | decoder_self | cross
    layer: int  # 0-based, in its stack
    query: Stream  # the stream of the rows
    key: Stream  # the stream of the columns
    weights: np.ndarray  # (heads, Q, K), or (heads, T, S, T): one map per target prefix


class Attention(NamedTuple):
    """A translation's weights, with the token labels of both streams."""

    source: list[str]  # source pieces and </s>
    target: list[str]  # <s> and the output's pieces
    maps: list[SiteMap]

    def labels(self, stream: Stream) -> list[str]:
        return self.source if stream == Stream.source else self.target


@torch.no_grad()
def attention_of(
    model: Transformer, tokenizer: Tokenizer, src_ids: list[int], output: list[int]
) -> Attention:
    """Every site's weights in every layer for the source ids `src_ids` (without EOS) and
    the output ids `output` (without BOS and EOS), from one teacher-forced pass."""
    src = source_batch([src_ids]).to(next(model.parameters()).device)
    tgt_in = torch.tensor([[tokenizer.bos_id, *output]], device=src.device)
    encoder_weights: list[torch.Tensor | None] = []
    memory, src_mask = model.encode(src, encoder_weights)
    _, decoder_weights = model.decode(tgt_in, memory, src_mask, need_weights=True)
    maps = []
    for number, (layer, weights) in enumerate(
        zip(model.encoder_layers, encoder_weights, strict=True)
    ):
        if layer.self_attention is not None:
            maps.append(
                SiteMap(
                    "encoder_self",
                    number,
                    Stream.source,
                    Stream.source,
                    weights[0].float().cpu().numpy(),
                )
            )
    for number, (layer, by_site) in enumerate(
        zip(model.decoder_layers, decoder_weights, strict=True)
    ):
        for site, attention in (
            ("decoder_self", layer.self_attention),
            ("cross", layer.cross_attention),
        ):
            if attention is not None:
                maps.append(
                    SiteMap(
                        site,
                        number,
                        attention.query_stream,
                        attention.key_value_stream,
                        by_site[site][0].float().cpu().numpy(),
                    )
                )
    return Attention(
        [*pieces(tokenizer.src, src_ids), "</s>"], ["<s>", *pieces(tokenizer.tgt, output)], maps
    )


def translate_with_attention(
    backend: TorchBackend, decoding: DecodingConfig, text: str
) -> tuple[Attention, str]:
    """The best translation of `text` and its attention; the source is encoded as the
    Translator encodes it (a multilingual model's tag of decoding.target_lang leads it)."""
    translator = Translator(backend, backend.tokenizer, decoding)
    [src_ids] = translator.source_ids([text], "text", [1])
    require(bool(src_ids), "text", "is empty; give a sentence to translate")
    [[best, *_]] = translator.translate_nbest([text], "text")
    return attention_of(backend.model, backend.tokenizer, src_ids, best.tokens), best.text


class LayerMap(NamedTuple):
    layer: int  # 0-based, in its stack
    weights: np.ndarray  # (heads, queries, keys)
    query: list[str]  # labels of the rows
    key: list[str]  # labels of the columns


def attention_maps(
    backend: TorchBackend, decoding: DecodingConfig, text: str, site: str
) -> tuple[list[LayerMap], str]:
    """The weights of `site` in every layer that runs it (a map per target prefix: the last,
    the whole target's), and the translation."""
    attention, translation = translate_with_attention(backend, decoding, text)
    maps = [
        LayerMap(
            m.layer,
            m.weights[:, -1] if m.weights.ndim == 4 else m.weights,
            attention.labels(m.query),
            attention.labels(m.key),
        )
        for m in attention.maps
        if m.site == site
    ]
    if not maps:
        raise ConfigError(
            f"site={site}: this model skips it in every layer (model.block); choose another "
            f"site ({', '.join(SITES)})"
        )
    return maps, translation


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
