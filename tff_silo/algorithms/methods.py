"""Every method the binaries run by name: one registry, importable without TensorFlow
(the binaries check their flags against it before TensorFlow loads).

`by_name.silo_definition` builds the entries of kind `silo` (the MR-MTL family:
thesis sec. 1.4), `mocha` and `ifca` (thesis sec. 1.5.2); `dprivate_clustering`
(Galli et al.) and `hypernet` (HyperNetFL's UDP-Alg, the `hypernet` package) have
their own drivers. A new method of the MR-MTL family is its module (whose
`<module>_algorithm` builds its `SiloAlgorithm`) and one entry here.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

KINDS = ("silo", "mocha", "ifca", "dprivate_clustering", "hypernet")
SILO_KINDS = ("silo", "mocha", "ifca")   # what `by_name.silo_definition` builds


@dataclasses.dataclass(frozen=True)
class Method:
  """A registry entry. `module`: the `tff_silo.algorithms` module whose
  `<module>_algorithm` builds it (None: built elsewhere); `lam`: it has a lambda to
  set (and tune); `aggregated`: it has a server mean (`--aggregator` applies);
  `after`: IFCA's variants, the method that follows the cluster selection;
  `privacy_unit`: what a row's epsilon protects (one example of a silo, or a user's
  whole data); `images_only`: it runs on image silos only; `compare`: offered by
  `benchmarks.compare`, whose tables list methods in this registry's order."""
  name: str
  kind: str
  module: Optional[str]
  lam: bool = False
  aggregated: bool = True
  after: Optional[str] = None
  privacy_unit: str = "example"
  images_only: bool = False
  compare: bool = True


def _ifca(name: str, after: str, **options) -> Method:
  return Method(name, "ifca", "ifca", after=after, **options)


REGISTRY = {m.name: m for m in (
    Method("local", "silo", "local"),
    Method("fedavg", "silo", "fedavg"),
    Method("finetune", "silo", "finetune"),
    Method("mrmtl", "silo", "mrmtl", lam=True),
    Method("ditto", "silo", "ditto", lam=True),
    Method("mocha", "mocha", "mocha", lam=True, aggregated=False),
    _ifca("ifca", "fedavg"),
    _ifca("ifca_fedavg", "fedavg", compare=False),
    _ifca("ifca_local", "local", compare=False),
    _ifca("ifca_mrmtl", "mrmtl", lam=True),
    _ifca("ifca_finetune", "finetune", compare=False),
    Method("dprivate_clustering", "dprivate_clustering", "dprivate_clustering",
           aggregated=False, compare=False),   # the server clusters, no mean
    Method("hypernet", "hypernet", None, aggregated=False, privacy_unit="user",
           images_only=True),
)}


def names(**where) -> tuple:
  """The registry's names, in its order, whose fields equal `where`'s values (a
  tuple of values: any of them), e.g. `names(kind=("silo", "mocha", "ifca"))`."""
  def matches(method):
    return all(getattr(method, field) in (value if isinstance(value, tuple) else
                                          (value,))
               for field, value in where.items())
  unknown = set(where) - {f.name for f in dataclasses.fields(Method)}
  if unknown:
    raise ValueError(f"no Method field {', '.join(sorted(unknown))}")
  return tuple(name for name, method in REGISTRY.items() if matches(method))


# The names `by_name.silo_definition` builds.
SILO_NAMES = names(kind=SILO_KINDS)
LAMBDA_NAMES = names(lam=True)
IFCA_NAMES = names(kind="ifca")
