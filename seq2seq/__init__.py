"""seq2seq: Transformer machine translation on PyTorch Lightning, configured with Hydra."""

__version__ = "0.1.0"
