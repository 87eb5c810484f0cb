"""Experiment presets per dataset (thesis app. B.4), used as flag defaults by
`benchmarks.run`. Every value can be overridden by a flag."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Preset:
  rounds: int
  batch_size: int
  clip: float
  lr: float
  delta: float
  lam: float
  needs_data_dir: bool
  num_clusters: int = 4
  # A public silo size m for DP runs under add/remove with private sizes (every silo
  # samples with q = B / m and weighs the same): the dataset's published record count
  # over its silos times the training fraction. None: give --assumed_silo_size.
  assumed_silo_size: int | None = None


PRESETS = {
    # App. B.4: School B=32, c=1, T=200; delta 1e-3 as in the paper's School figures.
    # School: 15,362 students in 139 schools, 80% for training: 88 per silo.
    "school": Preset(rounds=200, batch_size=32, clip=1.0, lr=0.01, delta=1e-3,
                     lam=1.0, needs_data_dir=True, assumed_silo_size=88),
    # App. B.4: Vehicle B=64, c=6, T=400 (Fig. 1.2 uses 200); delta 1e-7 (Fig. 1.2).
    # Vehicle (the LEAF-style JSON): 1,860 records over 23 sensors, 75% training: 60.
    "vehicle": Preset(rounds=400, batch_size=64, clip=6.0, lr=0.01, delta=1e-7,
                      lam=0.1, needs_data_dir=True, assumed_silo_size=60),
    # App. B.4: GLEAM B=64, c=6, T=200.
    "gleam": Preset(rounds=200, batch_size=64, clip=6.0, lr=0.01, delta=1e-5,
                    lam=0.1, needs_data_dir=True),
    # Rotated & masked digits: ~36 training images per silo, so small batches.
    # 1,797 images over 40 silos, 80% training: 36 per silo.
    "digits": Preset(rounds=60, batch_size=16, clip=1.0, lr=0.3, delta=1e-3,
                     lam=0.1, needs_data_dir=False, assumed_silo_size=36),
    # The generators' own sizes.
    "synthetic": Preset(rounds=100, batch_size=32, clip=1.0, lr=0.05, delta=1e-3,
                        lam=1.0, needs_data_dir=False, assumed_silo_size=150),
    # Galli et al. sec. 5.1: 100 users x 10 samples, 2 clusters, step 0.1, batch 10.
    "two_cluster": Preset(rounds=200, batch_size=10, clip=1.0, lr=0.1, delta=1e-3,
                          lam=1.0, needs_data_dir=False, num_clusters=2,
                          assumed_silo_size=10),
}
