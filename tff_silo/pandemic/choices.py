"""The pandemic pipeline's named choices, without TensorFlow: what
`benchmarks.pandemic` checks its flags against before TensorFlow loads."""

METHODS = ("mrmtl", "local", "fedavg", "centralized")   # `pipeline`
LOSSES = ("focal", "bce")                               # `features`
ARCHITECTURES = ("logistic", "mlp")                     # `features`
