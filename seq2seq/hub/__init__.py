"""A trained model as a Hugging Face `transformers` model directory (`export.format=hf`): the
architecture it maps onto (pegasus.py), its tokenizer as `tokenizers` builds it (tokenizer.py),
its model card (card.py) and the directory written from them (directory.py). docs/deploy.md."""
