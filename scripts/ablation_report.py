"""Moved: `python -m seq2seq.report sweep=<multirun dir>` (or `seq2seq-report`) writes the
ablation report; docs of earlier runs still name this script."""

import sys

print(
    "scripts/ablation_report.py is now a command: python -m seq2seq.report sweep=<multirun dir>",
    file=sys.stderr,
)
sys.exit(2)
