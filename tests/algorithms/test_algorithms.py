"""The TFF processes and the simulation driver on small synthetic silos."""


import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_silo import algorithms, data, models, runtime
from tff_silo.algorithms.local_training import LocalTrainingConfig, batch_plan
from tff_silo.algorithms.rounds import SiloInput
from tff_silo.backends.tff import process_for
from tff_silo.privacy import PAPER, PrivacyProtocol
from tff_silo.privacy.silo_accounts import calibrate_silos
from tff_silo.simulation import run_simulation

SILOS = data.heterogeneous_linear_silos(num_silos=4, num_examples=40, dim=3, tau=1.0,
                                        seed=0)
MODEL = models.linear_regression(3)
COMMON = dict(client_learning_rate=0.1, batch_size=8)


def _inputs(silos, noise=0.0, seed=0):
  return [SiloInput(x, y, np.float32(noise), np.array([seed, k], np.int32))
          for k, (x, y) in enumerate(zip(silos.x_train, silos.y_train))]


def _rounds(process, silos, rounds, noise=0.0):
  state = process.initialize()
  clients = [state.global_weights] * silos.num_silos
  for _ in range(rounds):
    state, clients, _ = process.next(state, clients, _inputs(silos, noise))
  return state, clients


@pytest.mark.tff
def test_mrmtl_global_is_weighted_mean_of_personal_models():
  process = process_for(
      algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, lam=0.5, **COMMON))
  state, clients = _rounds(process, SILOS, 3)
  assert int(state.round_num) == 3
  weights = SILOS.train_sizes / SILOS.train_sizes.sum()
  for i, g in enumerate(state.global_weights):
    mean = sum(w * c[i] for w, c in zip(weights, clients))
    np.testing.assert_allclose(g, mean, rtol=1e-5, atol=1e-6)


@pytest.mark.tff
def test_local_training_ignores_other_silos():
  process = process_for(
      algorithms.local_algorithm(MODEL, SILOS.feature_shape, **COMMON))
  _, clients = _rounds(process, SILOS, 2)
  y = list(SILOS.y_train)
  y[0] = y[0] + 5.0
  changed = data.make_silos("s", "regression", SILOS.x_train, y, SILOS.x_test, SILOS.y_test)
  _, clients_changed = _rounds(process, changed, 2)
  assert not np.allclose(clients[0][0], clients_changed[0][0])
  for k in range(1, 4):
    np.testing.assert_array_equal(clients[k][0], clients_changed[k][0])


@pytest.mark.tff
def test_mean_regularization_pulls_towards_the_mean():
  spread = []
  for lam in (0.0, 10.0):
    process = process_for(
        algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, lam=lam, **COMMON))
    state, clients = _rounds(process, SILOS, 4)
    spread.append(np.mean([np.sum((c[0] - state.global_weights[0]) ** 2) for c in clients]))
  assert spread[1] < 0.5 * spread[0]


@pytest.mark.tff
def test_fedavg_with_one_silo_is_local_training():
  one = data.make_silos("one", "regression", SILOS.x_train[:1], SILOS.y_train[:1],
                        SILOS.x_test[:1], SILOS.y_test[:1])
  fedavg = process_for(algorithms.fedavg_algorithm(MODEL, one.feature_shape, **COMMON))
  local = process_for(algorithms.local_algorithm(MODEL, one.feature_shape, **COMMON))
  state, _ = _rounds(fedavg, one, 3)
  _, clients = _rounds(local, one, 3)
  for g, c in zip(state.global_weights, clients[0]):
    np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-6)


@pytest.mark.tff
def test_finetune_freezes_the_global_model_after_the_switch():
  process = process_for(
      algorithms.finetune_algorithm(MODEL, SILOS.feature_shape, total_rounds=4,
                                    fedavg_fraction=0.5, **COMMON))
  state = process.initialize()
  clients = [state.global_weights] * 4
  globals_ = []
  for _ in range(4):
    state, clients, _ = process.next(state, clients, _inputs(SILOS))
    globals_.append(state.global_weights[0])
  assert not np.allclose(globals_[0], globals_[1])      # FedAvg rounds move it
  np.testing.assert_array_equal(globals_[1], globals_[3])  # then it is frozen
  assert not process.uses_client_state(2) and process.uses_client_state(3)


@pytest.mark.tff
def test_unweighted_aggregator_differs_from_weighted():
  sizes = [10, 60, 20, 40]
  xs = [x[:n] for x, n in zip(SILOS.x_train, sizes)]
  ys = [y[:n] for y, n in zip(SILOS.y_train, sizes)]
  uneven = data.make_silos("u", "regression", xs, ys, SILOS.x_test, SILOS.y_test)
  results = []
  for agg in (None, tff.aggregators.UnweightedMeanFactory()):
    process = process_for(
        algorithms.fedavg_algorithm(MODEL, uneven.feature_shape, aggregator=agg,
                                    **COMMON))
    results.append(_rounds(process, uneven, 1)[0].global_weights[0])
  assert not np.allclose(results[0], results[1])


@pytest.mark.tff
def test_ditto_accounts_twice_the_epochs():
  dp = dict(COMMON, l2_norm_clip=1.0)
  ditto = process_for(
      algorithms.ditto_algorithm(MODEL, SILOS.feature_shape, lam=1.0, **dp))
  mrmtl = process_for(
      algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, lam=1.0, **dp))
  assert ditto.epochs_per_round == 2 * mrmtl.epochs_per_round
  private_sizes = PrivacyProtocol(assumed_silo_size=30)
  r_ditto = run_simulation(ditto, SILOS, rounds=2, target_epsilon=2.0, target_delta=1e-4,
                           protocol=private_sizes)
  r_mrmtl = run_simulation(mrmtl, SILOS, rounds=2, target_epsilon=2.0, target_delta=1e-4,
                           protocol=private_sizes)
  assert np.all(r_ditto.privacy.steps == 2 * r_mrmtl.privacy.steps)
  assert np.all(r_ditto.privacy.noise_multipliers > r_mrmtl.privacy.noise_multipliers)
  assert np.all(r_ditto.privacy.epsilon_spent <= 2.0)


@pytest.mark.parametrize("name, direct", [
    ("local", lambda: algorithms.local_algorithm(MODEL, (3,), **COMMON)),
    ("mrmtl", lambda: algorithms.mrmtl_algorithm(MODEL, (3,), lam=0.3, **COMMON)),
    ("finetune", lambda: algorithms.finetune_algorithm(
        MODEL, (3,), total_rounds=10, fedavg_fraction=0.2, **COMMON)),
    ("ifca_mrmtl", lambda: algorithms.ifca_algorithm(
        MODEL, (3,), total_rounds=10, after="mrmtl", lam=0.3, num_clusters=2,
        init_seed=5, **COMMON)),
    ("ifca", lambda: algorithms.ifca_algorithm(MODEL, (3,), total_rounds=10,
                                               num_clusters=2, init_seed=5, **COMMON)),
    ("mocha", lambda: algorithms.mocha_algorithm(MODEL, (3,), num_silos=6, lam=0.3,
                                                 **COMMON)),
])
def test_silo_definition_by_name_is_the_builder(name, direct):
  built = algorithms.silo_definition(name, MODEL, (3,), rounds=10, lam=0.3,
                                     finetune_fraction=0.2, num_clusters=2,
                                     cluster_init_seed=5, num_silos=6, **COMMON)
  assert built == direct()


@pytest.mark.parametrize("options, message", [
    (dict(), "num_silos: mocha needs the number of silos"),
    (dict(num_silos=3, aggregator="unweighted_mean"), "aggregator: mocha has no server"),
])
def test_silo_definition_of_mocha_says_what_it_needs(options, message):
  with pytest.raises(ValueError, match=message):
    algorithms.silo_definition("mocha", MODEL, (3,), rounds=1, **options, **COMMON)


def test_silo_definition_refuses_an_unknown_name():
  with pytest.raises(ValueError, match="unknown method 'fedprox'; one of local"):
    algorithms.silo_definition("fedprox", MODEL, (3,), rounds=1, **COMMON)


def test_silo_event_is_what_the_ledger_spends():
  import dp_accounting
  from tff_silo.privacy import accounting
  privacy = calibrate_silos([40, 90], batch_size=8, epochs_per_round=2, rounds=5,
                            target_epsilon=[1.0, 3.0], target_delta=1e-4,
                            num_selections=2, selection_budget_share=0.05,
                            protocol=PAPER)
  for k in range(2):
    accountant = dp_accounting.rdp.RdpAccountant(list(accounting.RDP_ORDERS))
    accountant.compose(privacy.silo_event(k))
    assert accountant.get_epsilon(1e-4) == pytest.approx(privacy.epsilon_spent[k])


@pytest.mark.tff
def test_silo_specific_privacy_targets():
  process = process_for(algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, lam=1.0,
                                                   l2_norm_clip=1.0, **COMMON))
  targets = np.array([0.5, 1.0, 4.0, 8.0])
  result = run_simulation(process, SILOS, rounds=3, target_epsilon=targets,
                          target_delta=1e-4, seed=1, protocol=PAPER)
  assert np.all(result.privacy.epsilon_spent <= targets)
  assert np.all(result.privacy.epsilon_spent > 0.99 * targets)
  assert np.all(np.diff(result.privacy.noise_multipliers) < 0)  # more budget, less noise
  assert result.metric == "mse" and np.isfinite(result.test_metric)
  assert len(result.silo_test_metric) == 4 and len(result.round_seconds) == 3


def test_a_run_with_given_noise_reports_what_it_spends():
  """`noise_multiplier` instead of a target: the silos train with that noise, no
  budget stops them, and each ledger reports what the noise costs (the same
  computation as `accounting.epsilon_spent`), infinite where none bounds it."""
  from tff_silo.privacy import accounting
  definition = algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, lam=1.0,
                                          l2_norm_clip=1.0, **COMMON)
  result = run_simulation(definition, SILOS, rounds=3, noise_multiplier=0.8,
                          target_delta=1e-4, seed=1, protocol=PAPER,
                          backend="vectorized")
  privacy = result.privacy
  assert (privacy.noise_multipliers == 0.8).all() and result.rounds == 3
  for k in range(SILOS.num_silos):
    assert privacy.epsilon_spent[k] == pytest.approx(accounting.epsilon_spent(
        0.8, privacy.sampling_rates[k], int(privacy.steps[k]), 1e-4), rel=1e-9)
  tiny = run_simulation(definition, SILOS, rounds=1, noise_multiplier=0.01,
                        target_delta=1e-4, seed=1, protocol=PAPER, backend="vectorized")
  assert np.isinf(tiny.privacy.epsilon_spent).all()   # a shift of 100 deviations
  with pytest.raises(ValueError, match="one of target_epsilon and noise_multiplier"):
    run_simulation(definition, SILOS, rounds=1, noise_multiplier=0.8,
                   target_epsilon=1.0, target_delta=1e-4, protocol=PAPER)


@pytest.mark.tff
def test_simulation_evaluates_global_model_for_fedavg():
  process = process_for(
      algorithms.fedavg_algorithm(MODEL, SILOS.feature_shape, **COMMON))
  result = run_simulation(process, SILOS, rounds=2, eval_every=1)
  assert [h[0] for h in result.history] == [1, 2]
  assert result.privacy is None


def test_simulation_argument_errors():
  dp = process_for(
      algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, l2_norm_clip=1.0,
                                 **COMMON))
  with pytest.raises(ValueError, match="target_epsilon"):
    run_simulation(dp, SILOS, rounds=2)
  plain = process_for(algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, **COMMON))
  with pytest.raises(ValueError, match="l2_norm_clip"):
    run_simulation(plain, SILOS, rounds=2, target_epsilon=1.0, target_delta=1e-5)
  with pytest.raises(ValueError, match="rounds"):
    run_simulation(plain, SILOS, rounds=0)
  with pytest.raises(ValueError, match="lam"):
    process_for(
        algorithms.mrmtl_algorithm(MODEL, SILOS.feature_shape, lam=-1.0, **COMMON))
  with pytest.raises(ValueError, match="target_epsilon"):
    calibrate_silos([10, 20], batch_size=4, epochs_per_round=1, rounds=2,
                    target_epsilon=[1.0, 2.0, 3.0], target_delta=1e-5, protocol=PAPER)
  with pytest.raises(ValueError, match="assumed_silo_size"):
    run_simulation(dp, SILOS, rounds=2, target_epsilon=1.0, target_delta=1e-5)
  with pytest.raises(ValueError, match="sampling='poisson' has no accounting under "
                     "replace_one"):
    run_simulation(dp, SILOS, rounds=2, target_epsilon=1.0, target_delta=1e-5,
                   protocol=PrivacyProtocol("replace_one"))


@pytest.mark.tff
def test_no_worker_left_after_a_run():
  process = process_for(
      algorithms.local_algorithm(MODEL, SILOS.feature_shape, **COMMON))
  run_simulation(process, SILOS, rounds=1)
  assert runtime._children_named(runtime.WORKER_NAME) == [] or all(
      runtime._exited(p) for p in runtime._children_named(runtime.WORKER_NAME))


@pytest.mark.tff
def test_digits_cnn_round():
  digits = data.load_rotated_masked_digits(num_silos=4, seed=0)
  model = models.small_cnn(digits.feature_shape, 10, channels=(4, 8))
  process = process_for(
      algorithms.mrmtl_algorithm(model, digits.feature_shape, lam=0.1,
                                 client_learning_rate=0.1, batch_size=16,
                                 l2_norm_clip=1.0))
  result = run_simulation(process, digits, rounds=1, target_epsilon=5.0, target_delta=1e-3,
                          protocol=PrivacyProtocol(assumed_silo_size=36))
  assert result.metric == "accuracy" and 0.0 <= result.test_metric <= 1.0


@pytest.mark.parametrize("n, protocol, batch, sampling", [
    (40, PrivacyProtocol(public_silo_sizes=True), 8, "poisson"),
    (5, PrivacyProtocol(public_silo_sizes=True), 8, "poisson"),
    (30, PrivacyProtocol(assumed_silo_size=88), 32, "poisson"),
    (100, PrivacyProtocol(assumed_silo_size=24), 32, "poisson"),
    (7, PrivacyProtocol(assumed_silo_size=7), 7, "poisson"),
    (50, PrivacyProtocol("replace_one"), 16, "without_replacement"),
    (100, PrivacyProtocol(assumed_silo_size=24), 16, "shuffle")])
def test_training_takes_the_steps_and_rate_the_accounting_charges(n, protocol, batch,
                                                                  sampling):
  """A silo's calibration (its steps and sampling rate) and its training
  (`batch_plan` of the public size the accounts carry into `SiloInput.size`) agree:
  Poisson batches from the public m, the others from n (shuffled epochs too, under
  an assumed size)."""
  config = LocalTrainingConfig(learning_rate=0.1, batch_size=batch, epochs=3,
                               l2_norm_clip=1.0, sampling=sampling)
  privacy = calibrate_silos([n], batch_size=batch, epochs_per_round=3, rounds=2,
                            target_epsilon=None, target_delta=1e-3,
                            noise_multiplier=1.0, protocol=protocol, sampling=sampling)
  _, per_epoch, total, below = batch_plan(config, tf.constant(n),
                                          tf.constant(float(privacy.sizes[0])))
  assert 2 * int(total) == privacy.steps[0] == 2 * 3 * int(per_epoch)
  # Poisson: each example kept with probability below / 2^32, at most the q charged.
  q = privacy.sampling_rates[0]
  assert q * (1 - 1e-8) <= int(below) / 2 ** 32 <= q
  followed = privacy.sizes[0] if sampling == "poisson" else n
  assert int(per_epoch) == max(1, followed // min(batch, followed))
