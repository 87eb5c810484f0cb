"""HyperNetFL / UDP-Alg as data (Nemala et al., CIKM'23, Algorithm 1), in plain
TensorFlow: the definition both backends run (`hypernet.process.process_for`, the TFF
process; `hypernet.vectorized`, every sampled user in one TF program) and the pieces
of a round they share.

One round, for the sampled users U_t:
1. theta_u = h(phi, v_u) (`Hypernetwork.generate`);
2. K local SGD steps from theta_u (`local_delta`: Delta theta_u = theta_K - theta_u,
   lines 8-11);
3. (grad_phi theta_u)^T Delta theta_u and (grad_v theta_u)^T Delta theta_u
   (`Hypernetwork.vjp`, line 12);
4. the phi step f: the user-level DP mean of the phi parts (`user_level.UserLevelMean`:
   clip to S, weight w_u, divide by q W, add noise; eq. 3-4) or another weighted
   `tff.aggregators` factory on the TFF backend; phi <- phi + lambda f (lines 13-15);
5. v_u <- v_u + zeta (grad_v theta_u)^T Delta theta_u for every sampled u (line 16).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hypernet.network import Hypernetwork
from tff_silo import runner
from tff_silo.algorithms.local_training import LocalTrainingConfig, train_locally
from tff_silo.privacy.user_level import UserDPSettings, UserLevelMean


@dataclasses.dataclass(frozen=True)
class HypernetAlgorithm:
  """UDP-Alg (or pFedHN without clip and noise) for one population (see
  `hypernet_algorithm`). `aggregator` None is the user-level DP mean `mean`; a
  `tff.aggregators` factory replaces it and runs on the TFF backend only."""

  hypernetwork: Hypernetwork
  feature_shape: tuple
  config: LocalTrainingConfig
  settings: UserDPSettings
  user_weights: tuple            # w_u of every user
  mean: UserLevelMean            # the default aggregator's constants and noise seed
  hypernet_learning_rate: float  # lambda
  embedding_learning_rate: float  # zeta
  aggregator: object = None
  init_seed: int = 0

  name = "hypernet"

  @property
  def sigma(self) -> float:
    """The noise std of the phi step (eq. 4); NaN with another aggregator."""
    return self.mean.sigma if self.aggregator is None else float(
        getattr(self.aggregator, "sigma", np.nan))


runner.register(HypernetAlgorithm, tff="hypernet.process:TffHypernetRunner",
                vectorized="hypernet.vectorized:VectorizedHypernet")


def hypernet_algorithm(hypernetwork: Hypernetwork, feature_shape, train_sizes,
                       settings: UserDPSettings, *, client_learning_rate: float,
                       batch_size: int, local_steps: int, hypernet_learning_rate: float,
                       embedding_learning_rate: float, aggregator=None,
                       init_seed: int = 0, noise_seed: int = 0) -> HypernetAlgorithm:
  """A checked `HypernetAlgorithm`.

  Args:
    hypernetwork: a `hypernet.network.Hypernetwork` with one row per user.
    feature_shape: shape of one example.
    train_sizes: |D_u| of every user (for w_u and W).
    settings: q, S, z and w_hat (`tff_silo.privacy.user_level.UserDPSettings`).
    client_learning_rate: eta, the users' SGD step size.
    batch_size: the users' mini-batch size (shuffled batches).
    local_steps: K, SGD steps per user and round.
    hypernet_learning_rate: lambda, the step size of phi.
    embedding_learning_rate: zeta, the step size of the embeddings.
    aggregator: a weighted `tff.aggregators` factory replacing the user-level DP mean
      (TFF backend only); its weights are the users' w_u.
    init_seed: seeds phi and the embeddings.
    noise_seed: seeds the user-level DP mean's noise.
  """
  user_weights = settings.weights(train_sizes)
  if len(user_weights) != hypernetwork.num_users:
    raise ValueError(f"train_sizes has {len(user_weights)} users, the hypernetwork "
                     f"has {hypernetwork.num_users} embeddings")
  for name, value in (("hypernet_learning_rate", hypernet_learning_rate),
                      ("embedding_learning_rate", embedding_learning_rate)):
    if not (value >= 0 and np.isfinite(value)):
      raise ValueError(f"{name} must be a finite number >= 0, got {value}")
  if aggregator is not None:
    # TFF (~5 s to import) only where a factory was given; a vectorized run needs none
    # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff
    from tff_silo.privacy.user_level_factory import UserLevelDPMeanFactory
    if not isinstance(aggregator, tff.aggregators.WeightedAggregationFactory):
      raise TypeError("aggregator must be a tff.aggregators.WeightedAggregationFactory, "
                      f"got {type(aggregator).__name__}")
    if settings.private and not (
        isinstance(aggregator, UserLevelDPMeanFactory)
        and aggregator.mean == settings.mean(train_sizes, aggregator.mean.seed)):
      # run_hypernet charges the settings' (q, z) to the user-level ledger: only the
      # user-level DP mean of these very settings adds the noise that pays for it
      raise ValueError("settings add noise (noise_multiplier > 0) but aggregator is "
                       "not their user-level DP mean (UserLevelDPMeanFactory."
                       "for_settings(settings, train_sizes)): the user-level epsilon "
                       "would not hold; use noise_multiplier 0 with another aggregator")
  config = LocalTrainingConfig(learning_rate=client_learning_rate, batch_size=batch_size,
                               steps=local_steps, sampling="shuffle")
  return HypernetAlgorithm(
      hypernetwork, tuple(feature_shape), config, settings,
      tuple(float(w) for w in user_weights), settings.mean(train_sizes, noise_seed),
      float(hypernet_learning_rate), float(embedding_learning_rate), aggregator,
      init_seed)


def local_delta(algorithm: HypernetAlgorithm, theta, x, y, key):
  """Delta theta_u = theta_K - theta_u after K local SGD steps from theta_u on user
  u's data (shuffled batches keyed by the user's round key)."""
  target = algorithm.hypernetwork.target
  trained = train_locally(target, algorithm.config, list(theta), list(theta), 0.0, x, y,
                          0.0, key)
  return [t - s for t, s in zip(trained, theta)]


def server_update(algorithm: HypernetAlgorithm, phi, embeddings, phi_step,
                  embedding_steps):
  """phi + lambda f and v + zeta * (the sampled users' embedding products)."""
  lam, zeta = algorithm.hypernet_learning_rate, algorithm.embedding_learning_rate
  return ([p + lam * s for p, s in zip(phi, phi_step)],
          embeddings + zeta * embedding_steps)
