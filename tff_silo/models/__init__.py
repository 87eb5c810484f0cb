"""Model builders: functional models whose weights are tuples of tensors."""

from tff_silo.models.cnn import small_cnn
from tff_silo.models.functional import SiloModel
from tff_silo.models.linear import linear_regression, linear_svm, logistic_regression


def model_for(data) -> SiloModel:
  """The paper's model for a `SiloData`'s task (thesis Table B.1)."""
  if data.task == "regression":
    return linear_regression(data.feature_shape[0])
  if data.task == "binary_pm1":
    return linear_svm(data.feature_shape[0])
  if data.task == "binary_01":
    return logistic_regression(data.feature_shape[0])
  return small_cnn(data.feature_shape, data.num_classes)
