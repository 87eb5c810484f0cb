"""The methods' names, without importing them (no TensorFlow): what the binaries
check their flags against before any TensorFlow loads. `by_name` builds them."""

# IFCA (thesis sec. 1.5.2) and the IFCA-preconditioned methods: name -> the method
# that follows IFCA's cluster selection.
IFCA_VARIANTS = {"ifca": "fedavg", "ifca_fedavg": "fedavg", "ifca_local": "local",
                 "ifca_mrmtl": "mrmtl", "ifca_finetune": "finetune"}
NAMES = ("local", "fedavg", "finetune", "mrmtl", "ditto", "mocha", *IFCA_VARIANTS)
LAMBDA_NAMES = ("mrmtl", "ditto", "mocha", "ifca_mrmtl")   # those with a lambda to set
# Methods without a server mean (no `aggregator`).
UNAGGREGATED_NAMES = ("mocha",)
