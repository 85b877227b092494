"""The phases of scripts/benchmark.py, one module each, in the order the script runs them:
data (batches, test sources), models (ours and Marian), training, decoding, flops (matmul peak
and FLOP count: the MFU), report (tables and JSON); measure holds the timing harness they share,
arguments the `[options] -- overrides` command line of step_benchmark.py and
allocator_benchmark.py.
"""
