"""Our SentencePiece model as a `tokenizers` tokenizer (tokenizer.json) that AutoTokenizer loads
as a PreTrainedTokenizerFast, giving our ids: the Translator's normalisation (NFKC, whitespace
runs collapsed, ends stripped), SentencePiece's dummy prefix and whitespace escaping, the same
pieces and scores (unigram) or merges (BPE, ranked by the merged piece's score), byte fallback,
and EOS appended. `tokenizers` re-implements SentencePiece's segmentation rather than calling it,
so the export encodes a sample of the corpus both ways and refuses a tokenizer that differs
(`parity`). One difference is known and left: `tokenizers`' unigram model matches every entry of
the vocabulary, so text that spells a special piece out ("</s>", "<pad>", "<0x41>") is read as
that piece, where SentencePiece reads its characters (a BPE model reads them as ours does).

A multilingual model's tags are tokens the text names: "<2nso> A sentence." encodes to the tag's
id, then the sentence's pieces, as the Translator feeds it (in our own API a tag is never read
from text; here text is the only input, as in OPUS-MT's ">>nso<<").
"""

from __future__ import annotations

from typing import Any

from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as FastTokenizer

from seq2seq.data.tokenizer import Tokenizer

SPACE = "\u2581"  # SentencePiece's escaped space
UNIGRAM, BPE = 1, 2  # ModelProto.TrainerSpec.model_type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6  # ModelProto.SentencePiece.type
UNKNOWN_SURFACE = " \u2047 "  # what SentencePiece decodes <unk> to (its default unk_surface)
UNMATCHED = -1e6  # the unigram score of pieces text never becomes: never preferred to others


def proto(tokenizer: Tokenizer) -> Any:
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(tokenizer.src_model)
    return model


def bpe_merges(ids: dict[str, int]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges the adjacent pair that makes the highest-scoring piece, and
    scores pieces by their order: each split of a piece into two pieces, ranked by its id."""
    merges = []
    for piece, rank in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                merges.append((rank, ids[left], ids[right], left, right))
    return [(left, right) for *_, left, right in sorted(merges)]


def fast_tokenizer(tokenizer: Tokenizer) -> FastTokenizer:
    """tokenizer.json's tokenizer for our joint SentencePiece model."""
    spec = proto(tokenizer)
    pieces = [p.piece for p in spec.pieces]
    byte_fallback = spec.trainer_spec.byte_fallback
    if spec.trainer_spec.model_type == UNIGRAM:
        vocab = [
            (p.piece, p.score if p.type in (NORMAL, USER_DEFINED) else UNMATCHED)
            for p in spec.pieces
        ]
        model = models.Unigram(vocab, unk_id=tokenizer.unk_id, byte_fallback=byte_fallback)
    else:
        model = models.BPE(
            {piece: i for i, piece in enumerate(pieces)},
            bpe_merges({p.piece: i for i, p in enumerate(spec.pieces) if p.type == NORMAL}),
            unk_token=pieces[tokenizer.unk_id],
            fuse_unk=True,
            byte_fallback=byte_fallback,
        )
    fast = FastTokenizer(model)
    fast.encode_special_tokens = True  # "</s>" in the text is text, as in SentencePiece
    fast.normalizer = normalizers.Sequence(
        [
            normalizers.NFKC(),
            # str.split() also splits at \x1c-\x1f, which Unicode's White_Space leaves out
            normalizers.Replace(Regex(r"[\s\x1c-\x1f]+"), " "),
            normalizers.Strip(),
            # SentencePiece adds its dummy prefix even before a literal escaped space
            normalizers.Replace(Regex(f"^{SPACE}"), SPACE * 2),
        ]
    )
    fast.pre_tokenizer = pre_tokenizers.Metaspace(SPACE, prepend_scheme="always", split=False)
    fast.decoder = decoders.Sequence(
        [
            decoders.Replace(pieces[tokenizer.unk_id], UNKNOWN_SURFACE),
            decoders.Replace(SPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    eos = pieces[tokenizer.eos_id]
    fast.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A $B {eos}", special_tokens=[(eos, tokenizer.eos_id)]
    )
    # not <unk>: skip_special_tokens would drop it, where SentencePiece writes UNKNOWN_SURFACE
    special = [tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id]
    fast.add_special_tokens(
        [AddedToken(pieces[i], normalized=False, special=True) for i in special]
    )
    # tags: matched in the text (not special, so split_special_tokens leaves them whole)
    fast.add_tokens(
        [AddedToken(pieces[i], normalized=False, special=False) for i in tokenizer.tag_ids]
    )
    return fast


def tokenizer_config(tokenizer: Tokenizer, max_len: int) -> dict[str, Any]:
    """tokenizer_config.json: the special tokens, right padding (our positions count from 0
    over the padding), truncation to the model's positions, the text `</s>` or `<pad>` read
    as text, as SentencePiece reads it, and no token_type_ids (transformers 4.x adds them
    otherwise, and Pegasus's generate refuses them)."""
    piece = tokenizer.src.id_to_piece
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "pad_token": piece(tokenizer.pad_id),
        "bos_token": piece(tokenizer.bos_id),
        "eos_token": piece(tokenizer.eos_id),
        "padding_side": "right",
        "truncation_side": "right",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": True,
        "model_input_names": ["input_ids", "attention_mask"],
    }


def parity(
    fast: FastTokenizer, tokenizer: Tokenizer, lines: list[str], expected: list[list[int]]
) -> dict[str, Any]:
    """Encode `lines` with `fast` against our ids of each (`expected`, EOS included), and decode
    ours both ways (tags left out: output never holds one); the counts and the first line that
    differs."""
    encoded = fast.encode_batch(lines)
    encode_diff = [
        i for i, (enc, ids) in enumerate(zip(encoded, expected, strict=True)) if enc.ids != ids
    ]
    tags = set(tokenizer.tag_ids)
    outputs = [[i for i in ids if i not in tags] for ids in expected]
    texts = tokenizer.decode_tgt(outputs)
    decoded = fast.decode_batch(outputs, skip_special_tokens=True)
    decode_diff = [i for i, (a, b) in enumerate(zip(texts, decoded, strict=True)) if a != b]
    first = (encode_diff or decode_diff or [None])[0]
    return {
        "lines": len(lines),
        "encoded_differently": len(encode_diff),
        "decoded_differently": len(decode_diff),
        **({"first_difference": lines[first]} if first is not None else {}),
    }
