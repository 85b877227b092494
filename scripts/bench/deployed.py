"""CTranslate2, the deployment engine (docs/deploy.md), decoding with our model's weights:
converted by `seq2seq.export`, run on the same sources, threads and forced lengths as ours.

CTranslate2 takes pieces (strings) and adds the source EOS itself; the conversion of each id
batch to pieces is timed with it (a few microseconds a sentence). Lengths: EOS is not allowed
before `length` tokens and decoding stops after `length` + 1, so it runs the same length + 1
decoder steps per sentence as ours and Marian. PAD and BOS are suppressed, as our search
never outputs them.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import tempfile
from pathlib import Path

from torch import Tensor

from bench.decoding import Search, SearchFactory
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.ctranslate2_backend import export_model, load_engine, suppressed
from seq2seq.errors import CheckpointError
from seq2seq.model.transformer import Transformer

COMPUTE_TYPES = ("float32", "int8")  # int8: weights quantized when CTranslate2 loads them


def scratch_directory() -> Path:
    """A temporary directory for the converted model, removed when the process exits."""
    directory = Path(tempfile.mkdtemp(prefix="bench-ct2-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def ctranslate2_searches(
    model: Transformer, tokenizer: Tokenizer, length: int, beam: int, penalty: float
) -> tuple[dict[str, SearchFactory], str]:
    """CTranslate2's greedy and beam search per compute type, each built on demand (a live
    Translator slows every other system: bench.measure.Isolated), or none and why not."""
    if importlib.util.find_spec("ctranslate2") is None:
        return {}, "ctranslate2 is not installed: pip install -e '.[deploy]'"
    device = next(model.parameters()).device
    directory = scratch_directory() / "model"
    export_model(model, tokenizer, directory)
    try:
        load_engine(directory, device)  # on a GPU, finds the CUDA libraries it cannot load
    except CheckpointError as e:
        return {}, str(e)
    never = suppressed(tokenizer)

    def pieces(src: Tensor) -> list[list[str]]:
        rows = [row[: row.index(model.eos_id)] for row in src.tolist()]
        return [[tokenizer.src.id_to_piece(i) for i in row] for row in rows]

    def factory(compute_type: str, beams: int) -> SearchFactory:
        def build() -> Search:
            translator = load_engine(directory, device, compute_type)

            def search(src: Tensor) -> list[list[str]]:
                results = translator.translate_batch(
                    pieces(src),
                    beam_size=beams,
                    length_penalty=penalty,
                    min_decoding_length=length,
                    max_decoding_length=length + 1,
                    suppress_sequences=never,
                )
                return [result.hypotheses[0] for result in results]

            return search

        return build

    searches = {}
    for compute_type in COMPUTE_TYPES:
        searches[f"ctranslate2 {compute_type} greedy"] = factory(compute_type, 1)
        searches[f"ctranslate2 {compute_type} beam {beam}"] = factory(compute_type, beam)
    return searches, ""
