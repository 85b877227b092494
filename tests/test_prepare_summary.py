"""prepare's summary shows what each length limit removes or truncates: training pairs over
data.filter.max_len, evaluation pairs over the model's positions, and references longer than
decoding's output limit."""

from __future__ import annotations

from pathlib import Path

from helpers import compose_config, toy_corpus, toy_overrides, write_lines
from rich.console import Console

from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.prepare import length_cuts, summary

LIMITS = ["data.filter.max_len=64", "model.max_len=129"]  # 128 positions; output 1.5 x src + 10


def words(word: str, count: int) -> str:
    return " ".join([word] * count)


# (source, reference) added to the toy corpus's validation pairs, with what the limits do to
# them; "dog" encodes to 2 tokens, "DOG" to 1 (checked below)
VAL_PAIRS = [
    (words("dog", 64), words("DOG", 128)),  # 128 and 128 tokens: fit, output limit 128
    (words("dog", 65), words("DOG", 3)),  # 130 source tokens: truncated
    (words("dog", 2), words("DOG", 16)),  # output limit 1.5 x 4 + 10 = 16: fits
    (words("dog", 2), words("DOG", 17)),  # one over the output limit
    (words("dog", 5), words("DOG", 129)),  # truncated, and over the output limit (25)
]


def long_corpus(directory: Path, val: list[tuple[str, str]]) -> Path:
    """The toy corpus with 3 training pairs of 300 words a side, and `val` as validation pairs."""
    src, tgt = toy_corpus()
    long_pair = (words("the dog runs", 100), words("RUNS DOG THE", 100))
    splits = {
        "train": (src[:240] + [long_pair[0]] * 3, tgt[:240] + [long_pair[1]] * 3),
        "val": ([s for s, _ in val], [t for _, t in val]),
        "test": (src[270:], tgt[270:]),
    }
    directory.mkdir()
    for name, (sources, targets) in splits.items():
        write_lines(directory / f"{name}.src", sources)
        write_lines(directory / f"{name}.tgt", targets)
    return directory


def prepared(tmp_path: Path, val: list[tuple[str, str]], *overrides: str) -> TranslationDataModule:
    corpus = long_corpus(tmp_path / "corpus", val)
    module = TranslationDataModule(
        compose_config([*toy_overrides(corpus, tmp_path), *LIMITS, *overrides])
    )
    module.setup()
    return module


def test_summary_counts_what_each_length_limit_cuts(tmp_path: Path) -> None:
    src, tgt = toy_corpus()
    module = prepared(tmp_path, [*zip(src[240:270], tgt[240:270], strict=True), *VAL_PAIRS])
    tokenizer = module.tokenizer
    assert [len(x) for x in tokenizer.encode_src(["dog", words("dog", 65)])] == [2, 130]
    assert [len(x) for x in tokenizer.encode_tgt(["DOG", words("DOG", 129)])] == [1, 129]

    console = Console(width=160, record=True)
    console.print(summary(module.config, module.prepared, module))
    text = console.export_text()
    lines = text.splitlines()
    assert max(map(len, lines)) <= 160
    header = [[c.strip() for c in line.strip("┃").split("┃")] for line in lines if line[:1] == "┃"]
    columns = [" ".join(filter(None, parts)) for parts in zip(*header, strict=True)]  # wrapped
    rows = [
        [c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│")
    ]
    table = {cells[0]: dict(zip(columns, cells, strict=True)) for cells in rows}
    assert list(table) == ["train", "val", "test"]  # a line each: no cell wrapped

    # (1) training pairs removed by data.filter.max_len; training pairs are never truncated
    assert table["train"]["pairs"] == "243" and table["train"]["kept"] == "240"
    assert table["train"]["too long"] == "3 (1.2%)"
    assert table["train"]["truncated"] == table["train"]["ref > out"] == "-"
    # (2) evaluation pairs truncated to the model's 128 positions
    assert table["val"]["pairs"] == "35"
    assert table["val"]["truncated"] == "2 (5.7%)"
    # (3) evaluation references longer than decoding's output limit
    assert table["val"]["ref > out"] == "2 (5.7%)"
    assert table["test"]["truncated"] == table["test"]["ref > out"] == "0"
    # token lengths as encoded, not as truncated
    assert table["val"]["src tokens mean/max"].endswith("/130")
    assert table["val"]["tgt tokens mean/max"].endswith("/129")

    caption = " ".join(text.split())  # the caption wraps at the table's width
    assert "data.filter.max_len=64 tokens, removed; raise data.filter.max_len" in caption
    assert "the model's 128 positions (model.max_len=129, less BOS/EOS)" in caption
    assert "cut to fit; raise model.max_len" in caption
    assert "min(1.5 x source tokens + 10, 128)" in caption
    assert "Raise decoding.max_len_a or decoding.max_len_b" in caption


def test_the_output_limit_is_that_of_the_source_as_decoded(tmp_path: Path) -> None:
    """A truncated source is decoded truncated: 130 source tokens allow 0.5 x 128 + 1 = 65
    output tokens, not 66."""
    val = [(words("dog", 65), words("DOG", 66)), (words("dog", 65), words("DOG", 65))]
    module = prepared(tmp_path, val, "decoding.max_len_a=0.5", "decoding.max_len_b=1")
    cuts = length_cuts(module, "val")
    assert (cuts.truncated, cuts.beyond_output) == (2, 1)
