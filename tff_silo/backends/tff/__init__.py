"""The TFF backend: every definition as a `tff.templates.IterativeProcess` run by
TFF's runtime (the reference the vectorized backend is tested against).

  silo        the MR-MTL family (`SiloAlgorithm`): stateful clients, any
              `tff.aggregators` factory
  clustered   IFCA and the IFCA-preconditioned methods (`ClusteredAlgorithm`)
  mocha       Mocha (`MochaAlgorithm`): W and Omega on the server
  dprivate    d-private clustered FL (`DPrivateClusteringAlgorithm`)

`process_for(definition)` builds the process of any registered definition (the
hypernetwork's is `hypernet.process`).
"""

from tff_silo import runner


def process_for(definition):
  """The TFF process running `definition` (the TFF runner registered for its type)."""
  return runner.runner_for(definition, "tff")
