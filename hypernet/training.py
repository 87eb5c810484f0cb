"""One HyperNetFL / UDP-Alg run from its hyperparameters (Nemala et al. Alg. 1):
the hypernetwork built for the users, its algorithm, and the run on either backend.
`benchmarks.hypernet` and `benchmarks.compare` both train through `train`."""

from __future__ import annotations

from typing import Callable, Optional


def train(target, users, settings, *, rounds: int, client_lr: float, batch_size: int,
          local_steps: int, hypernet_lr: float, embedding_lr: float,
          hidden_width: int, embedding_dim: Optional[int] = None,
          delta: Optional[float] = None, init_seed: int = 0, noise_seed: int = 0,
          eval_every: int = 0,
          progress: Optional[Callable[[int, int, float], None]] = None,
          backend: str = "vectorized"):
  """(the run's `HypernetResult`, its `Hypernetwork`).

  Args:
    target: the target model (`tff_silo.models`) the hypernetwork generates.
    users: one silo per user (`tff_silo.data.SiloData`).
    settings: q, S, z and w_hat (`tff_silo.privacy.user_level.UserDPSettings`).
    rounds, client_lr, batch_size, local_steps, hypernet_lr, embedding_lr: T, eta,
      the users' batch size, K, lambda and zeta (`hypernet_algorithm`).
    hidden_width, embedding_dim: the hypernetwork's (`Hypernetwork`; the embedding
      size defaults to `default_embedding_dim`).
    delta: delta of the reported user-level epsilon (used when `settings` noise).
    init_seed: seeds phi and the embeddings (they read no data).
    noise_seed: seeds user sampling, the users' batches and the noise.
    eval_every, progress, backend: as `run_hypernet`.
  """
  from hypernet.algorithm import hypernet_algorithm
  from hypernet.simulation import run_hypernet
  network = hypernetwork(target, users, hidden_width, embedding_dim)
  algorithm = hypernet_algorithm(
      network, users.feature_shape, users.train_sizes, settings,
      client_learning_rate=client_lr, batch_size=batch_size, local_steps=local_steps,
      hypernet_learning_rate=hypernet_lr, embedding_learning_rate=embedding_lr,
      init_seed=init_seed, noise_seed=noise_seed)
  result = run_hypernet(algorithm, users, rounds=rounds,
                        target_delta=delta if settings.private else None,
                        seed=noise_seed, eval_every=eval_every, progress=progress,
                        backend=backend)
  return result, network


def hypernetwork(target, users, hidden_width: int, embedding_dim: Optional[int] = None):
  """The `Hypernetwork` generating `target` for one embedding row per user of
  `users` (the embedding size defaults to `default_embedding_dim`)."""
  from hypernet.network import Hypernetwork, default_embedding_dim
  return Hypernetwork(target, users.num_silos,
                      embedding_dim or default_embedding_dim(users.num_silos),
                      hidden_width=hidden_width)
