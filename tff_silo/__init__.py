"""tff_silo: private, personalized cross-silo federated learning on TFF 0.87.

Layers (imports point downwards only):
  data/        per-silo train/test arrays, loaders, generators
  models/      functional models (weights as tuples of tensors)
  privacy/     mechanisms (DP-SGD) and accounting (dp_accounting RDP)
  algorithms/  definitions (TF only) and TFF iterative processes, one module per
               algorithm
  vectorized   all silos' rounds as one TF program (the fast backend)
  simulation   the driver that runs a process and evaluates every silo
  theory       closed forms of the mean-estimation analysis (thesis sec. 1.6)
"""

__version__ = "0.1.0"
