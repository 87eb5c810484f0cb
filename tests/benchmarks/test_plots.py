"""The compare figures draw chance where the metric has one (accuracy), and not
where it has none (regression); a figure is written atomically."""

import math

import pandas as pd
import pytest

from benchmarks import plots, tables


@pytest.fixture
def drawn(monkeypatch):
  """The figures `plots` would save, by file name, not written."""
  figures = {}
  monkeypatch.setattr(plots, "_save",
                      lambda fig, path, **_: figures.__setitem__(path, fig))
  return figures


def _selected(metric):
  return pd.DataFrame([
      dict(method=m, epsilon=e, seed=seed, lam=lam, metric=metric,
           test_metric=0.1 + 0.01 * seed + (0.5 if math.isinf(e) else 0.0),
           validation_metric=0.2, trial=-1)
      for m, lam in (("local", 0.0), ("mrmtl", 0.1)) for e in (1.0, 4.0, math.inf)
      for seed in (0, 1)])


def _labels(fig):
  return [line.get_label() for ax in fig.axes for line in ax.get_lines()]


@pytest.mark.parametrize("chance", [0.1, None])
def test_privacy_utility_and_lambda_draw_chance_when_given(drawn, chance):
  selected = _selected("accuracy" if chance else "mse")
  plots.privacy_utility(selected, "t", "pu.png", chance)
  plots.lambda_panels(selected, selected, "lam.png", every_trial=False, chance=chance)
  for name in ("pu.png", "lam.png"):
    found = [label for label in _labels(drawn[name]) if label.startswith("chance")]
    assert len(found) == (0 if chance is None else 1 if name == "pu.png" else 3), name


def test_the_figure_against_a_setting_has_a_panel_per_epsilon_and_a_line_per_method(
    drawn):
  selected = pd.concat([_selected("accuracy").assign(mask_probability=mask)
                        for mask in (0.0, 0.2, 0.4)])
  plots.against_setting(selected, "mask_probability", "m.png", chance=0.1)
  axes = drawn["m.png"].axes
  assert [ax.get_title() for ax in axes] == ["epsilon 1", "epsilon 4", "non-private"]
  for ax in axes:
    assert [l.get_label() for l in ax.get_lines()] == ["local", "mrmtl", "chance (0.1)"]
    assert list(ax.get_lines()[0].get_xdata()) == [0.0, 0.2, 0.4]


def test_run_summary_puts_dprivate_clustering_in_order_of_nu(drawn):
  rows = pd.DataFrame([dict(algorithm=a, lam=0.0, nu=nu, seed=s, metric="accuracy",
                            test_metric=0.5 - 0.01 * (nu if nu == nu else 0))
                       for a, nu in (("dprivate_clustering", 10.0),
                                     ("dprivate_clustering", math.nan),
                                     ("dprivate_clustering", 1.0), ("local", math.nan))
                       for s in (0, 1)])
  plots.run_summary(rows, "s.png")
  ticks = [t.get_text() for t in drawn["s.png"].axes[0].get_xticklabels()]
  assert ticks == ["dprivate_clustering (nu=none)", "local",
                   "dprivate_clustering (nu=1)", "dprivate_clustering (nu=10)"]


def test_hypernet_figure_draws_fedavg_rows_alone_and_beside_the_hypernetwork(drawn):
  """FedAvg's rows have no hypernetwork size: alone (a `--methods=fedavg` CSV) they
  are a dashed line without one and have no signal-to-noise bound; beside
  hypernetwork rows, lines name each P."""
  fedavg = dict(algorithm="fedavg", epsilon=math.inf, sampling_rate=None,
                l2_norm_clip=None, noise_multiplier=None, sigma=0.0, num_users=6,
                mean_user_accuracy=0.5)
  hypernet = [dict(algorithm="hypernet", epsilon=e, sampling_rate=0.5,
                   l2_norm_clip=0.1, noise_multiplier=z, sigma=z * 0.1 / 3,
                   num_users=6, mean_user_accuracy=0.3, hypernet_parameters=100)
              for e, z in ((math.inf, 0.0), (2.0, 1.0))]
  plots.hypernet_accuracy(pd.DataFrame([fedavg]), delta=1e-5, num_classes=10,
                          majority=0.6, path="alone.png")
  assert tables.hypernet_summary(pd.DataFrame([dict(fedavg, seed=0, test_accuracy=0.5,
                                                    wall_seconds=1.0)])
                                 ).signal_to_noise.isna().all()
  assert "fedavg (no noise, q=nan, S=none)" in _labels(drawn["alone.png"])
  plots.hypernet_accuracy(pd.DataFrame([fedavg, *hypernet]), delta=1e-5,
                          num_classes=10, majority=0.6, path="both.png")
  labels = _labels(drawn["both.png"])
  assert "hypernet (no noise, q=0.5, S=0.1, P=100)" in labels
  assert "fedavg (no noise, q=nan, S=none)" in labels


def test_a_figure_that_cannot_be_written_is_one_line_and_leaves_no_file(tmp_path,
                                                                        monkeypatch):
  """A full disk (ENOSPC on the write) once left a 0-byte PNG behind a traceback:
  a figure is written atomically, the failure one line naming its path."""
  import errno
  import os
  from benchmarks import common
  plt = plots._pyplot()
  path = tmp_path / "p.png"
  plots._save(plt.figure(), str(path))
  before = path.read_bytes()
  assert before.startswith(b"\x89PNG")

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(common.UsageError, match=r"cannot write .*p\.png: No space left"):
    plots._save(plt.figure(), str(path))
  assert path.read_bytes() == before and os.listdir(tmp_path) == ["p.png"]
