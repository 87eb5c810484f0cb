"""The two runtimes that run a definition (`tff_silo.runner`'s protocol):

  tff/         TFF's iterative processes (the reference; CPU-only, ~0.7 ms per
               client per intrinsic): `tff.process_for(definition)`
  vectorized/  every silo's round as one TF program, on whatever device TensorFlow
               has; the same numbers (parity tests in tests/backends/test_vectorized.py)

Each definition's module registers its runners here (`tff_silo.runner.register`).
"""
