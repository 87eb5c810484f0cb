"""MATLAB files shaped like the real datasets' (School, Vehicle, GLEAM: X and Y as
cell arrays of one matrix per silo), for tests that write their own small data."""

import numpy as np
import scipy.io


def cells(arrays, axis):
  """`arrays` as a MATLAB cell array along `axis` ((n, 1) or (1, n))."""
  out = np.empty((len(arrays), 1) if axis == 0 else (1, len(arrays)), dtype=object)
  for i, a in enumerate(arrays):
    out[(i, 0) if axis == 0 else (0, i)] = a
  return out


def write_mat(path, xs, ys, axis):
  scipy.io.savemat(path, {"X": cells(xs, axis), "Y": cells(ys, axis)})


def write_school(folder, sizes, seed=0):
  """A school.mat in `folder` with one silo of each of `sizes` students (School's 28
  features, scores 1..70)."""
  rng = np.random.default_rng(seed)
  write_mat(folder / "school.mat", [rng.random((n, 28)) for n in sizes],
            [rng.integers(1, 71, (n, 1)).astype(float) for n in sizes], axis=1)
