"""From source text to translations: search, checkpoint reading, the Translator and its
backends (ours, CTranslate2's)."""
