"""What a silo-level DP run's epsilon is a guarantee about.

A `PrivacyProtocol` fixes the neighbouring relation and what is public about a silo:

- `add_remove` (the default) with Poisson sampling: neighbouring datasets differ by
  one example added or removed, so a silo's size n_k is private. Nothing released may
  depend on it: every silo samples, normalizes and is weighted in the server mean by
  `assumed_silo_size` m, a public number the same for all silos (the mean becomes
  unweighted), unless the sizes are declared public (`public_silo_sizes=True`, which
  the paper's code implicitly does), in which case n_k sets q_k = B / n_k and weighs
  the mean.
- `replace_one` with sampling without replacement: neighbours differ in one example's
  value, n_k is public by definition, DP-SGD draws B of n_k examples each step
  (`SampledWithoutReplacementDpEvent`), the mean is n_k-weighted as in the paper.

Node-level DP (thesis ch. 2): with `node_examples` = S the protected unit is a
node (a person with their contacts) that lies in at most S of a silo's examples
(its neighbourhood and S - 1 others'); replace_one with batches drawn without
replacement, accounted by `node_level` (Theorem 2.4.4).

`PAPER` is the protocol of the paper's code (Liu et al., NeurIPS'22): n_k-weighted
mean, q_k = B / n_k and Poisson add/remove accounting; it treats n_k as public even
though add/remove changes it, so its epsilon holds only for an adversary who is
given every silo's size.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from tff_silo.privacy import accounting, pld

# The samplings each relation's accounting holds for; `shuffle` has no bound in either.
SAMPLING_FOR = {"add_remove": ("poisson", "shuffle"),
                "replace_one": ("without_replacement", "shuffle")}


@dataclasses.dataclass(frozen=True)
class PrivacyProtocol:
  """The neighbouring relation and what is public (see module docstring).

  Attributes:
    neighbouring: `add_remove` or `replace_one`.
    public_silo_sizes: add_remove only: the silos' sizes are declared public.
    assumed_silo_size: add_remove with private sizes: m, the public size every silo
      samples with (q = min(B, m) / m) and is weighted by.
    node_examples: node-level DP: the most examples one protected node lies in
      (replace_one only); None: example-level DP.
    accountant: `rdp`, or `pld` (add_remove only): privacy loss distributions where
      they express every event of a silo, RDP elsewhere (`pld`); the smaller of the
      two bounds is reported, and calibration uses it.
  """

  neighbouring: str = "add_remove"
  public_silo_sizes: bool = False
  assumed_silo_size: Optional[int] = None
  node_examples: Optional[int] = None
  accountant: str = "rdp"

  def __post_init__(self):
    accounting.check_neighbouring(self.neighbouring)
    pld.check_accountant(self.accountant)
    if self.accountant == "pld" and self.neighbouring != "add_remove":
      raise ValueError("accountant='pld' accounts add_remove (Poisson) DP-SGD only; "
                       f"use accountant='rdp' under {self.neighbouring}")
    m = self.assumed_silo_size
    if m is not None and (int(m) != m or m < 1):
      raise ValueError(f"assumed_silo_size must be a positive integer, got {m}")
    if self.sizes_public and m is not None:
      raise ValueError("assumed_silo_size is for add_remove with private silo sizes; "
                       "with public sizes each silo uses its own")
    s = self.node_examples
    if s is not None and (int(s) != s or s < 1 or self.neighbouring != "replace_one"):
      raise ValueError(f"node_examples must be a positive integer with replace_one, got "
                       f"{s} with {self.neighbouring}")

  @property
  def sizes_public(self) -> bool:
    return self.neighbouring == "replace_one" or self.public_silo_sizes

  @property
  def name(self) -> str:
    """`paper` for the paper's protocol, else the relation and what is public."""
    if dataclasses.replace(self, accountant="rdp") == PAPER:
      return "paper"
    if self.neighbouring == "replace_one":
      return ("replace_one" if self.node_examples is None
              else f"replace_one_node_{self.node_examples}")
    return "add_remove_public_sizes" if self.public_silo_sizes else "add_remove"

  def check_sampling(self, sampling: str) -> None:
    allowed = SAMPLING_FOR[self.neighbouring]
    if sampling not in allowed:
      raise ValueError(f"sampling={sampling!r} has no accounting under "
                       f"{self.neighbouring}; use one of {allowed}")

  def silo_sizes(self, train_sizes: Sequence[int]) -> np.ndarray:
    """The size each silo samples, normalizes and is weighted by: n_k when public,
    else m for every silo."""
    if self.sizes_public:
      return np.asarray(train_sizes, np.int64)
    if self.assumed_silo_size is None:
      raise ValueError(
          "under add_remove the silos' sizes are private: give assumed_silo_size (a "
          "public size every silo samples with) or declare public_silo_sizes=True")
    return np.full(len(train_sizes), int(self.assumed_silo_size), np.int64)


PAPER = PrivacyProtocol("add_remove", public_silo_sizes=True)
