"""The benchmark binaries (`python -m benchmarks.<name>`).

Before any of them imports TensorFlow: its C++ start-up lines (on a CPU machine,
"Unable to register cuDNN factory" and the like, logged as errors though nothing is
wrong) are silenced, unless TF_CPP_MIN_LOG_LEVEL is set (0 shows them all). Python
errors and TensorFlow's fatal ones still show.

On a GPU, TensorFlow's memory grows as the run needs it (TF_FORCE_GPU_ALLOW_GROWTH,
unless set): by default TensorFlow takes the whole device at its first op.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
