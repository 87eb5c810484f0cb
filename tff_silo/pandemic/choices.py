"""The pandemic pipeline's named choices, without TensorFlow: what
`benchmarks.pandemic` checks its flags against before TensorFlow loads."""

METHODS = ("mrmtl", "local", "fedavg", "centralized")   # `pipeline`
MODES = ("faithful", "honest")                          # `graph`
LOSSES = ("focal", "bce")                               # `features`
ARCHITECTURES = ("logistic", "mlp")                     # `features`
# `features`: the neighbour feature groups an example keeps (thesis Table 2.3); the
# self part is always in, "self" keeps nothing of the neighbours
FEATURE_SETS = ("node+contact+location", "node+contact", "node+location", "node",
                "self")
