"""The benchmark binaries (`python -m benchmarks.<name>`).

Before any of them imports TensorFlow: its C++ start-up lines (on a CPU machine,
"Unable to register cuDNN factory" and the like, logged as errors though nothing is
wrong) are silenced, unless TF_CPP_MIN_LOG_LEVEL is set (0 shows them all). Python
errors and TensorFlow's fatal ones still show.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
