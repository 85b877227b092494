"""Moved: `python -m seq2seq.report runs={label:run_dir,...}` (or `seq2seq-report`) compares
runs' validation BLEU; docs of earlier runs still name this script."""

import sys

print(
    "scripts/compare_runs.py is now a command: python -m seq2seq.report "
    "'runs={label:run_dir,label:run_dir}' [output=<dir>]",
    file=sys.stderr,
)
sys.exit(2)
