"""Experiment presets (thesis app. B.4): per dataset for `benchmarks.run`, and the
grids of `benchmarks.compare`. Every value can be overridden by a flag."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Preset:
  """The settings of a dataset of `benchmarks.run` (what the dataset is and how it
  loads: `benchmarks.datasets.DATASETS[name]`)."""
  rounds: int
  batch_size: int
  clip: float
  lr: float
  delta: float
  lam: float
  num_clusters: int = 4
  # A public silo size m for DP runs under add/remove with private sizes (every silo
  # samples with q = B / m and weighs the same): the dataset's published record count
  # over its silos times the training fraction. None: give --assumed_silo_size.
  assumed_silo_size: int | None = None
  clients_per_round: int | None = None   # dprivate_clustering's U (None: every user)
  # dprivate_clustering: the std of the N(0, std^2) noise on each hypothesis' start
  hypothesis_init_std: float = 0.01


PRESETS = {
    # App. B.4: School B=32, c=1, T=200; delta 1e-3 as in the paper's School figures.
    # School: 15,362 students in 139 schools, 80% for training: 88 per silo.
    "school": Preset(rounds=200, batch_size=32, clip=1.0, lr=0.01, delta=1e-3,
                     lam=1.0, assumed_silo_size=88),
    # App. B.4: Vehicle B=64, c=6, T=400 (Fig. 1.2 uses 200); delta 1e-7 (Fig. 1.2).
    # Vehicle (the LEAF-style JSON): 1,860 records over 23 sensors, 75% training: 60.
    "vehicle": Preset(rounds=400, batch_size=64, clip=6.0, lr=0.01, delta=1e-7,
                      lam=0.1, assumed_silo_size=60),
    # App. B.4: GLEAM B=64, c=6, T=200.
    "gleam": Preset(rounds=200, batch_size=64, clip=6.0, lr=0.01, delta=1e-5, lam=0.1),
    # Rotated & masked digits: ~36 training images per silo, so small batches.
    # 1,797 images over 40 silos, 80% training: 36 per silo.
    "digits": Preset(rounds=60, batch_size=16, clip=1.0, lr=0.3, delta=1e-3,
                     lam=0.1, assumed_silo_size=36),
    # The generators' own sizes.
    "synthetic": Preset(rounds=100, batch_size=32, clip=1.0, lr=0.05, delta=1e-3,
                        lam=1.0, assumed_silo_size=150),
    # Galli et al. sec. 5.1: 100 users x 10 samples, 2 clusters, step 0.1, batch 10.
    # Hypotheses from N(0, 1) (the model's initialization is zero).
    "two_cluster": Preset(rounds=200, batch_size=10, clip=1.0, lr=0.1, delta=1e-3,
                          lam=1.0, num_clusters=2, assumed_silo_size=10,
                          hypothesis_init_std=1.0),
    # Galli et al. sec. 5.3 (rotated FEMNIST writers, Table 4) on Fashion-MNIST: 200
    # users of 250 training / 40 test images, half rotated by 90 degrees; the paper
    # gives neither U nor the step size nor the batch: 20 users a round, SGD 0.05 on
    # batches of 32, T = 100 (the paper: at most 500 with early stopping).
    "fmnist_rotated": Preset(rounds=100, batch_size=32, clip=1.0, lr=0.05, delta=1e-5,
                             lam=0.1, num_clusters=2, assumed_silo_size=250,
                             clients_per_round=20),
}


@dataclasses.dataclass(frozen=True)
class HypernetSettings:
  """The hypernetwork (UDP-Alg) among `benchmarks.compare`'s methods on image silos:
  `benchmarks.hypernet`'s defaults (RESULTS: HyperNetFL) with q = 0.3, one
  configuration (not tuned); S clips a user's contribution under DP only."""
  sampling_rate: float = 0.3
  l2_norm_clip: float = 0.2
  local_steps: int = 20
  batch_size: int = 16
  client_lr: float = 0.05
  hypernet_lr: float = 0.1
  embedding_lr: float = 0.1
  hidden_width: int = 100


@dataclasses.dataclass(frozen=True)
class ComparePreset:
  """A `benchmarks.compare` grid: what runs (methods x epsilons x seeds) and what
  is tuned on validation (lrs x lambdas); `inf` in epsilons is the non-private run."""
  dataset: str
  methods: tuple
  epsilons: tuple
  seeds: tuple
  lrs: tuple
  lams: tuple
  rounds: int
  batch_size: int
  clip: float
  delta: float
  assumed_silo_size: int | None
  validation_fraction: float = 0.2
  # --tuning=private: per-example validation metrics are clipped to [0, score_clip]
  score_clip: float = 1.0
  num_clusters: int = 4    # IFCA's G
  hypernet: HypernetSettings = HypernetSettings()
  paper_figure: str = ""   # the seed's figure the preset reproduces, in figure titles


# App. B.4's grids.
PAPER_LRS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)
PAPER_LAMS = (0.0001, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
# The `quick` silos (tff_silo.data.heterogeneous_linear_silos): K silos of n examples,
# d features, w_k = w_0 + N(0, tau^2 I), noise sigma; 25% test, then 20% of the
# training part for validation: 48 examples per silo to train on.
QUICK_DATA = dict(num_silos=20, num_examples=80, dim=5, tau=0.3, sigma=0.5)

COMPARE_PRESETS = {
    "quick": ComparePreset(
        dataset="quick", methods=("local", "fedavg", "mrmtl"),
        epsilons=(2.0, 4.0, 8.0, float("inf")), seeds=(0, 1, 2), lrs=(0.1,),
        lams=(0.001, 0.01, 0.1, 0.3, 1.0, 3.0, 10.0), rounds=30, batch_size=16,
        clip=2.0, delta=1e-3, assumed_silo_size=48, score_clip=4.0),
    # Vehicle (the training JSON: 23 silos of 5..400 examples, 75% for training,
    # then 80% of that: 48 of the preset's 60), app. B.4: B = 64, c = 6, T = 400;
    # delta 1e-7 (Fig. 1.2); features as read (no standardization: inside every
    # guarantee).
    "vehicle": ComparePreset(
        dataset="vehicle", methods=("local", "fedavg", "finetune", "mrmtl", "ditto"),
        epsilons=(1.0, 2.0, 4.0, 8.0, float("inf")), seeds=(0, 1, 2), lrs=PAPER_LRS,
        lams=PAPER_LAMS, rounds=400, batch_size=64, clip=6.0, delta=1e-7,
        assumed_silo_size=48, paper_figure="thesis Fig. 1.2, 1.3(a), G.2"),
    # The rotated & masked digits of `benchmarks.run` (36 training images a silo,
    # 29 after validation); its settings; the hypernetwork with user-level DP.
    "digits": ComparePreset(
        dataset="digits", methods=("local", "fedavg", "mrmtl", "ifca", "ifca_mrmtl",
                                   "hypernet"),
        epsilons=(1.0, 4.0, float("inf")), seeds=(0, 1, 2), lrs=(0.1, 0.3),
        lams=(0.01, 0.1, 1.0), rounds=60, batch_size=16, clip=1.0, delta=1e-3,
        assumed_silo_size=29, paper_figure="stand-in of thesis Fig. 1.6"),
    # Thesis Fig. 1.6 on Fashion-MNIST (app. B.1: 40 silos x 1,500 / 250 images in 4
    # rotation groups, B = 100, c = 1, T = 200); 1,200 training images after
    # validation.
    "fmnist": ComparePreset(
        dataset="fmnist", methods=("local", "fedavg", "mrmtl", "ifca", "ifca_mrmtl"),
        epsilons=(1.0, 3.0, 8.0, float("inf")), seeds=(0, 1, 2), lrs=(0.03, 0.1),
        lams=(0.01, 0.1, 1.0), rounds=200, batch_size=100, clip=1.0, delta=1e-5,
        assumed_silo_size=1200, paper_figure="thesis Fig. 1.6 (MNIST there)"),
    # Thesis Fig. 1.3(d)'s heterogeneous CIFAR-10 (30 silos of 5 random classes) on
    # Fashion-MNIST: ~2,333 images a silo, 80% training, 80% of that kept: ~1,490.
    "fmnist_hetero": ComparePreset(
        dataset="fmnist_hetero", methods=("local", "fedavg", "finetune", "mrmtl",
                                          "ditto"),
        epsilons=(1.0, 3.0, 8.0, float("inf")), seeds=(0, 1, 2), lrs=(0.03, 0.1),
        lams=(0.01, 0.1, 1.0), rounds=200, batch_size=100, clip=1.0, delta=1e-5,
        assumed_silo_size=1490, paper_figure="stand-in of thesis Fig. 1.3(d)"),
    # Thesis Fig. 1.3(b) and app. B.4: School, delta 1e-3.
    "school": ComparePreset(
        dataset="school", methods=("local", "fedavg", "finetune", "mrmtl", "ditto",
                                   "ifca", "ifca_mrmtl", "mocha"),
        epsilons=(1.0, 2.0, 3.0, 4.0, 6.0, 8.0, float("inf")), seeds=(0, 1, 2),
        lrs=PAPER_LRS, lams=PAPER_LAMS, rounds=200, batch_size=32, clip=1.0,
        delta=1e-3, assumed_silo_size=70,   # 88 training examples a silo, 80% kept
        paper_figure="thesis Fig. 1.3(b), G.3"),
}
