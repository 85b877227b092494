"""Files -> tokenizer -> batches: reading corpora, SentencePiece, the encoded cache, batching."""
