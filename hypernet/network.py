"""The hypernetwork h(phi, v_u) of HyperNetFL (Shamsian et al., ICML'21, pFedHN;
Nemala et al., CIKM'23, sec. 2.1 and 4.2), in pure TensorFlow.

User u's descriptor v_u (a row of the embedding table) passes through an MLP with
three hidden ReLU layers; one linear head per weight tensor of the target model
turns the last hidden layer into that tensor, so theta_u = h(phi, v_u) is a complete
set of target weights. phi holds the MLP's and the heads' weights.

The server's step uses the vector-Jacobian product (eq. 1 trained with the local
update as the output gradient, pFedHN sec. 3):

    (grad_phi theta_u)^T Delta theta_u   and   (grad_{v_u} theta_u)^T Delta theta_u.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from tff_silo.models.functional import SiloModel

HIDDEN_WIDTH = 100       # pFedHN's hidden width
NUM_HIDDEN_LAYERS = 3    # Nemala et al. sec. 4.2


def default_embedding_dim(num_users: int) -> int:
  """pFedHN's embedding size, 1 + N / 4."""
  return 1 + num_users // 4


@dataclasses.dataclass(frozen=True)
class Hypernetwork:
  """h(phi, v) generating the weights of `target` for `num_users` users.

  Attributes:
    target: the generated model (its `weight_shapes` fix the heads).
    num_users: N, the rows of the embedding table.
    embedding_dim: size of each v_u.
    hidden_width: width of the three hidden layers.
  """

  target: SiloModel
  num_users: int
  embedding_dim: int
  hidden_width: int = HIDDEN_WIDTH

  def __post_init__(self):
    for name in ("num_users", "embedding_dim", "hidden_width"):
      value = getattr(self, name)
      if int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")

  @property
  def phi_shapes(self) -> tuple:
    """MLP (kernel, bias) per hidden layer, then (kernel, bias) per target tensor."""
    widths = [self.embedding_dim] + [self.hidden_width] * NUM_HIDDEN_LAYERS
    mlp = sum((((a, b), (b,)) for a, b in zip(widths[:-1], widths[1:])), ())
    heads = sum((((self.hidden_width, int(np.prod(s))), (int(np.prod(s)),))
                 for s in self.target.weight_shapes), ())
    return mlp + heads

  @property
  def num_parameters(self) -> int:
    return int(sum(np.prod(s) for s in self.phi_shapes))

  def init(self, seed: int = 0):
    """(phi, embeddings): PyTorch-style U(+-1/sqrt(fan_in)) layers, N(0, 1) rows."""
    rng = np.random.default_rng(seed)
    phi, fan_in = [], self.embedding_dim
    for shape in self.phi_shapes:
      if len(shape) == 2:
        fan_in = shape[0]
      bound = 1.0 / np.sqrt(fan_in)
      phi.append(rng.uniform(-bound, bound, shape).astype(np.float32))
    embeddings = rng.standard_normal((self.num_users, self.embedding_dim))
    return tuple(phi), embeddings.astype(np.float32)

  def generate_many(self, phi, embeddings):
    """theta_u = h(phi, v_u) for a batch of embeddings `[U, embedding_dim]`: the
    target's weights with a leading user axis."""
    num_mlp = 2 * NUM_HIDDEN_LAYERS
    hidden = embeddings
    for i in range(0, num_mlp, 2):
      hidden = tf.nn.relu(tf.matmul(hidden, phi[i]) + phi[i + 1])
    heads = phi[num_mlp:]
    return [tf.reshape(tf.matmul(hidden, heads[2 * j]) + heads[2 * j + 1], [-1, *shape])
            for j, shape in enumerate(self.target.weight_shapes)]

  def generate(self, phi, embedding):
    """theta = h(phi, v) for one embedding `[embedding_dim]`: the target's weights."""
    return [t[0] for t in self.generate_many(phi, embedding[None])]

  @property
  def computation_key(self) -> tuple:
    """What a traced computation over this hypernetwork depends on."""
    return (self.target.computation_key, self.num_users, self.embedding_dim,
            self.hidden_width)

  def vjp(self, phi, embedding, delta):
    """((grad_phi theta)^T delta, (grad_v theta)^T delta) for theta = h(phi, v)."""
    phi = list(phi)
    with tf.GradientTape() as tape:
      tape.watch(phi)
      tape.watch(embedding)
      theta = self.generate(phi, embedding)
    phi_part, embedding_part = tape.gradient(
        theta, (phi, embedding), output_gradients=list(delta),
        unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return phi_part, embedding_part


def from_saved_run(saved) -> tuple:
  """(the `Hypernetwork`, phi, embeddings) of a saved hypernetwork run
  (`tff_silo.runs.SavedRun`); ValueError for another run."""
  spec = saved.meta["model"].get("hypernetwork")
  if spec is None or saved.hypernetwork_weights is None:
    raise ValueError(f"{saved.directory} holds no hypernetwork")
  network = Hypernetwork(saved.model(), **spec)
  phi, embeddings = saved.hypernetwork_weights
  if [list(p.shape) for p in phi] != [list(s) for s in network.phi_shapes]:
    raise ValueError(f"{saved.directory}: the saved phi does not fit the hypernetwork "
                     "its spec describes")
  return network, phi, embeddings
