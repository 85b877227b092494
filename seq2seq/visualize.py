"""`python -m seq2seq.visualize ckpt_path=... text="..."`: attention heatmaps of one sentence.

Translates the sentence, runs the decoder once more on its own output asking for the attention
weights (`Transformer.decode(..., need_weights=True)` returns them per layer and site), and
draws one panel per decoder layer (the mean over heads, or one per head) of the chosen site.
Rows are the queries, columns the keys/values, whatever the wiring.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from seq2seq.checkpoint import load_trained  # noqa: E402
from seq2seq.cli import entrypoint  # noqa: E402
from seq2seq.config import VisualizeConfig  # noqa: E402
from seq2seq.data.batching import collate  # noqa: E402
from seq2seq.data.corpus import normalize  # noqa: E402
from seq2seq.data.tokenizer import Tokenizer  # noqa: E402
from seq2seq.io import atomic_path  # noqa: E402
from seq2seq.model.config import Stream  # noqa: E402
from seq2seq.model.transformer import Transformer  # noqa: E402
from seq2seq.translator import Translator  # noqa: E402


def pieces(processor, ids: list[int]) -> list[str]:
    return [processor.id_to_piece(i) for i in ids]


@torch.no_grad()
def attention_maps(
    translator: Translator, text: str, site: str
) -> tuple[list[np.ndarray], list[str], list[str], str]:
    """Per decoder layer (heads, queries, keys) weights, the query and key labels, the output."""
    model: Transformer = translator.model
    tokenizer: Tokenizer = translator.tokenizer
    src_ids = tokenizer.encode_src([normalize(text)])[0]
    src = collate([(0, np.asarray(src_ids), np.empty(0, dtype=np.int64))]).src
    [[best, *_]] = translator.search(src)
    output = best.tokens
    tgt_in = torch.tensor([[tokenizer.bos_id, *output]])
    memory, src_mask = model.encode(src)
    _, weights_per_layer = model.decode(tgt_in, memory, src_mask, need_weights=True)
    maps = []
    for layer_weights in weights_per_layer:
        weights = layer_weights[site][0]  # (h, Q, K), or (h, T, S, T) for prefix attention
        if weights.dim() == 4:
            weights = weights[:, -1]  # the whole target: the last prefix
        maps.append(weights.numpy())
    labels = {
        Stream.source: [*pieces(tokenizer.src, src_ids), "</s>"],
        Stream.target: ["<s>", *pieces(tokenizer.tgt, output)],
    }
    wiring = getattr(model.config.attention, site)
    return maps, labels[wiring.query], labels[wiring.key_value], tokenizer.decode_tgt([output])[0]


def plot(maps, query, key, per_head: bool, title: str, output: Path) -> None:
    panels = (
        [m[h] for m in maps for h in range(m.shape[0])] if per_head else [m.mean(0) for m in maps]
    )
    columns = maps[0].shape[0] if per_head else 1
    rows = len(maps)
    size = 0.32
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(max(4, columns * len(key) * size + 1.5), rows * (len(query) * size + 1)),
        squeeze=False,
    )
    for index, (axis, panel) in enumerate(zip(axes.flat, panels, strict=True)):
        layer, head = divmod(index, columns)
        axis.imshow(panel, cmap="viridis", vmin=0, aspect="auto")
        axis.set_xticks(range(len(key)), key, rotation=90, fontsize=7)
        axis.set_yticks(range(len(query)), query, fontsize=7)
        axis.set_title(
            f"layer {layer + 1}" + (f", head {head + 1}" if per_head else ""), fontsize=8
        )
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    with atomic_path(output) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


@entrypoint(config_name="visualize", schema=VisualizeConfig)
def main(config: VisualizeConfig) -> None:
    trained = load_trained(Path(config.ckpt_path))
    translator = Translator(trained.model, trained.tokenizer, config.decoding)
    maps, query, key, translation = attention_maps(translator, config.text, config.site)
    ckpt = Path(config.ckpt_path)
    output = (
        Path(config.output) if config.output else ckpt.with_name(f"{ckpt.stem}.{config.site}.png")
    )
    wiring = getattr(trained.config.model.attention, config.site)
    title = (
        f"{config.site} ({trained.config.model.attention.name}: Q={wiring.query}, "
        f"K/V={wiring.key_value}, {wiring.score})\n{config.text} -> {translation}"
    )
    plot(maps, query, key, config.per_head, title, output)
    print(output)


if __name__ == "__main__":
    main()
