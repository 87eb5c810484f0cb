"""The silos of a `benchmarks.run` run from a recipe (a JSON-able dict), without
flags: the binary loads its data through it, and a saved run (`tff_silo.runs`)
stores the recipe instead of a copy of the data, so an attack can rebuild the very
same split (checked against the saved fingerprint) and tell members from
non-members.

Recipe keys: dataset (school, vehicle, gleam, digits, synthetic, two_cluster), seed,
data_dir, standardize (tabular: none, public, dp, silo), for `dp` standardize_clip,
standardize_noise_multiplier and neighbouring, mask_probability (digits),
corrupt_silos and corruption (misbehaving silos).
"""

from __future__ import annotations

TABULAR = ("school", "vehicle", "gleam")


def load(recipe: dict):
  """(silos, per-silo preprocessing DpEvents or None) of `recipe`; the first
  `corrupt_silos` silos misbehave. Raises DataError / ValueError in one line."""
  from tff_silo import data
  silos, events = _clean(recipe)
  corrupt = recipe.get("corrupt_silos") or 0
  if not corrupt:
    return silos, events
  if corrupt >= silos.num_silos:
    raise ValueError(f"--corrupt_silos={corrupt} leaves no honest silo (the data has "
                     f"{silos.num_silos})")
  return data.corrupt_labels(silos, corrupt, recipe["corruption"]), events


def _clean(recipe):
  from tff_silo import data
  name, seed = recipe["dataset"], recipe["seed"]
  if name in TABULAR:
    loader = {"school": data.load_school, "vehicle": data.load_vehicle,
              "gleam": data.load_gleam}[name]
    mode = recipe["standardize"]
    silos = loader(recipe["data_dir"], seed=seed,
                   standardize="none" if mode == "dp" else mode)
    if mode != "dp":
      return silos, None
    return _dp_standardized(silos, recipe)
  if name == "digits":
    return data.load_rotated_masked_digits(mask_probability=recipe["mask_probability"],
                                           seed=seed), None
  if name == "two_cluster":
    return data.two_cluster_linear_silos(seed=seed), None
  if name == "synthetic":
    return data.heterogeneous_linear_silos(seed=seed), None
  raise ValueError(f"unknown dataset {name!r} in the recipe")


def _dp_standardized(silos, recipe):
  """Each silo's DP estimate of its feature statistics (seeded by the run's seed),
  and the Gaussian event it charges to the silo's ledger."""
  from tff_silo.data import preprocessing
  z = recipe["standardize_noise_multiplier"]
  standardized = preprocessing.standardize_silos(
      silos, "dp", clip=recipe["standardize_clip"], noise_multipliers=[z] * silos.num_silos,
      seed=recipe["seed"])
  return standardized, [preprocessing.dp_event(z, recipe["neighbouring"])] * silos.num_silos
