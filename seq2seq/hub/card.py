"""The model card (README.md) of an exported directory, in the Hub's format: a YAML metadata
block (languages, licence, task, metrics), then what the model is, how it was trained and
scored, how to run it, and its limits. Filled from the checkpoint's config and its run's
run_summary.json; what the run did not record is said to be unknown, never guessed."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from seq2seq.config import RootConfig
from seq2seq.data.directions import directions, languages


def training_command(run_dir: Path | None) -> str | None:
    """The run's command line, from Hydra's record of its overrides."""
    overrides = run_dir / ".hydra" / "overrides.yaml" if run_dir else None
    if overrides is None or not overrides.is_file():
        return None
    words = yaml.safe_load(overrides.read_text()) or []
    return " ".join(shlex.quote(w) for w in ["python", "-m", "seq2seq.train", *words])


def metadata_block(
    config: RootConfig, license: str, scores: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    data = config.data
    block: dict[str, Any] = {
        "language": languages(data),
        "license": license,
        "library_name": "transformers",
        "pipeline_tag": "translation",
        "tags": ["translation", "pegasus", "seq2seq"],
        "datasets": [data.name, *data.corpora],
        "metrics": ["bleu", "chrf"],
    }
    if scores:
        block["model-index"] = [
            {
                "name": data.name,
                "results": [
                    {
                        "task": {"type": "translation", "name": "Translation"},
                        "dataset": {"type": data.name, "name": name},
                        "metrics": [
                            {"type": "bleu", "value": test["bleu"], "name": "BLEU"},
                            {"type": "chrf", "value": test["chrf"], "name": "chrF"},
                        ],
                    }
                    for name, test in scores.items()
                ],
            }
        ]
    return block


def model_card(
    config: RootConfig,
    summary: dict[str, Any] | None,
    run_dir: Path | None,
    license: str,
    data_license: str | None,
) -> str:
    """README.md of the export: `summary` is the run's run_summary.json (None: not found)."""
    scores = (summary or {}).get("test", {})
    data, model = config.data, config.model
    pairs = ", ".join(f"{d.src}->{d.tgt}" for d in directions(data))
    several = data.multilingual
    block = yaml.safe_dump(metadata_block(config, license, scores), sort_keys=False)
    lines = [
        f"---\n{block}---",
        "",
        f"# {data.name} {pairs}",
        "",
        f"A Transformer translation model ({pairs}) trained with seq2seq and exported as "
        f"transformers' PegasusForConditionalGeneration: {model.encoder_layers}+"
        f"{model.decoder_layers} layers, width {model.d_model}, {model.heads} heads, "
        f"feed-forward {model.ffn_dim}, a joint SentencePiece vocabulary of "
        f"{config.tokenizer.vocab_size:,} pieces.",
        "",
        "## Data",
        "",
        f"Trained on `{data.name}`"
        + (f" and {', '.join(f'`{c}`' for c in data.corpora)}" if data.corpora else "")
        + f" ({pairs}). Licence of the data: "
        + (data_license or "not recorded by the export (see the data's own licence)")
        + ".",
        "",
        "## Training",
        "",
    ]
    command = training_command(run_dir)
    lines += [f"```bash\n{command}\n```", ""] if command else ["Command: not recorded.", ""]
    if summary:
        hardware = summary.get("hardware", "hardware not recorded")
        lines += [
            f"{summary['train_seconds'] / 60:.0f} minutes of training on {hardware}, "
            f"{summary['steps']:,} updates ({summary['epochs']} epochs), precision "
            f"{summary['precision']}.",
            "",
        ]
    lines += ["## Results", ""]
    if scores:
        lines += [
            "| test set | BLEU | chrF | sacreBLEU signature |",
            "|---|---|---|---|",
            *(
                f"| {name} | {test['bleu']} | {test['chrf']} | `{test['bleu_signature']}` |"
                for name, test in scores.items()
            ),
            "",
            f"Beam {config.decoding.beam_size}, length penalty {config.decoding.length_penalty}, "
            "cased detokenized BLEU.",
            "",
        ]
    else:
        lines += ["No test scores were recorded with the checkpoint.", ""]
    tag = "<2" + directions(data)[0].tgt + "> " if several else ""
    lines += [
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("<this directory or Hub id>")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("<this directory or Hub id>")',
        f'batch = tokenizer(["{tag}A sentence to translate."], return_tensors="pt", '
        "padding=True, truncation=True)",
        "output = model.generate(**batch)  # beam search as trained: generation_config.json",
        "print(tokenizer.batch_decode(output, skip_special_tokens=True))",
        "```",
        "",
    ]
    if several:
        lines += [
            "A multilingual model: start each source with the tag of the language to write "
            f"({', '.join(f'`<2{d.tgt}>`' for d in directions(data))}).",
            "",
        ]
    lines += [
        "## Intended use and limits",
        "",
        f"Research and experiments on {pairs} text like the training data's domain. "
        "A small model trained briefly: expect errors on text unlike its training data, names "
        "and rare words; not for decisions without review. Outputs equal seq2seq's own search "
        "except on sentences that reach the length limit: seq2seq limits each sentence to "
        f"{config.decoding.max_len_a} x its source tokens + {config.decoding.max_len_b}, "
        "`generate` the whole batch to `max_length`.",
        "",
    ]
    return "\n".join(lines)
