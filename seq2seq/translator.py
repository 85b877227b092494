"""`from seq2seq.translator import Translator`, as README taught before the package had its
decoding/ folder: the same class as `seq2seq.decoding.translator.Translator`."""

from seq2seq.decoding.translator import Translation, Translator

__all__ = ["Translation", "Translator"]
