"""Per-silo datasets: the `SiloData` container, real loaders and generators."""

from tff_silo.data.digits import digits_images, load_rotated_masked_digits
from tff_silo.data.fashion_mnist import (label_skewed_fmnist_silos, load_fashion_mnist,
                                         read_idx, rotated_fmnist_users,
                                         rotated_masked_fmnist_silos)
from tff_silo.data.images import load_cifar10, load_emnist_users
from tff_silo.data.partition import label_skewed_silos
from tff_silo.data.preprocessing import STANDARDIZE, standardize_silos
from tff_silo.data.silos import (DataError, SiloData, corrupt_labels, make_silos,
                                 split_silo, standardize, validation_split)
from tff_silo.data.synthetic import (
    heterogeneous_linear_silos, mean_estimation_silos, two_cluster_linear_silos)
from tff_silo.data.tabular import load_gleam, load_school, load_vehicle
