"""The attacks' named choices, without TensorFlow, so that a binary can check its
flags before TensorFlow loads."""

DEFENSES = ("none", "dp_sgd", "clip", "laplace")   # attacks.defenses
METHODS = ("dlg", "idlg")                          # attacks.dlg
OPTIMIZERS = ("lbfgs", "adam")
# tensorflow-privacy's membership attacks by the name the binaries take
MIA_ATTACK_TYPES = {"threshold": "THRESHOLD_ATTACK",
                    "threshold_entropy": "THRESHOLD_ENTROPY_ATTACK",
                    "logistic_regression": "LOGISTIC_REGRESSION",
                    "random_forest": "RANDOM_FOREST",
                    "k_nearest_neighbors": "K_NEAREST_NEIGHBORS",
                    "multi_layered_perceptron": "MULTI_LAYERED_PERCEPTRON"}
MIA_ATTACKS = tuple(MIA_ATTACK_TYPES)
