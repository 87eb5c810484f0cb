"""Saved runs: what a run trained, kept so that it can be attacked later.

Format (version 3), one folder per run:
  run.json     {"format": "tff_silo.run", "version": 3, "run_key", "saved",
               "versions" (tff_silo, tensorflow, tensorflow-federated, dp-accounting),
               "model" (how to rebuild the model: `build_model`; a hypernetwork run
               adds "hypernetwork": num_users, embedding_dim, hidden_width), "data"
               (the recipe the binary rebuilds the silos from; no copy of the data),
               "fingerprint" ({"scheme": "hmac-sha256", "key_id", "silos": per silo
               the HMAC of its train and of its test arrays, keyed by the data-check
               key: the member / non-member split}), "privacy" (per silo: epsilon
               spent, delta, noise multiplier, sampling rate, steps; the neighbouring
               relation; a hypernetwork run: its user-level epsilon and what it
               covers), "info" (flags, seed, method, metrics)}
  weights.npz  "silo/<k>/<i>": weight tensor i of silo k's (user k's) final model
               (the model it was evaluated with: personalized, or the global one
               for FedAvg); "server/<g>/<i>": the server's model g (the global
               model, or IFCA's cluster g); "hypernetwork/phi/<i>" and
               "hypernetwork/embeddings": a hypernetwork and its user embeddings.

Versions 1 and 2 (plain SHA-256 fingerprints; version 1 without server or
hypernetwork arrays) still load. A plain hash of the training arrays beside the
privacy block would tell two neighbouring datasets apart with certainty (and test
candidate silo sizes); the keyed hash tells nothing to whoever lacks the key. The
key (32 random bytes) lives outside every run folder, in `$TFF_SILO_DATA_KEY`
(default `~/.config/tff_silo/data-check.key`), made on first use; checking a run's
data on another machine needs that file.

`save` writes into a temporary folder and renames it, and never replaces a
different run: a folder holding the same run_key is left as it is (a rerun), one
holding another run is an error. `load` returns a `SavedRun`; a damaged file is a
one-line ValueError naming it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from importlib import metadata
import json
import os
import secrets
import shutil
import tempfile
import time
import types
from typing import Optional
import zipfile
import zlib

import numpy as np

from tff_silo import __version__

# Reading and writing runs needs numpy only: what builds models or runs (TensorFlow,
# ~3 s to import) is imported where it is used.

FORMAT = "tff_silo.run"
VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
_REQUIRED = ("run_key", "model", "data", "fingerprint", "privacy", "info", "num_silos")
KEY_ENV = "TFF_SILO_DATA_KEY"
_KEY_BYTES = 32


@dataclasses.dataclass(frozen=True)
class SavedRun:
  """A loaded run: its metadata, every silo's final weights, the server's models
  and, for a hypernetwork run, (phi, embeddings) (`hypernet.network.from_saved_run`
  rebuilds the hypernetwork)."""
  directory: str
  meta: dict
  silo_weights: tuple   # per silo, a tuple of np.float32 arrays
  server_weights: tuple = ()   # per server model, a tuple of np.float32 arrays
  hypernetwork_weights: Optional[tuple] = None   # (phi tuple, embeddings [N, E])

  def model(self):
    """The `SiloModel` the weights belong to."""
    return build_model(self.meta["model"])

  def keras_model(self, silo: Optional[int] = None, *, server: Optional[int] = None):
    """Silo `silo`'s final model, or the server's model `server`, as a
    `tf.keras.Model` (logits out; image models only)."""
    from tff_silo.models import cnn   # pylint: disable=g-import-not-at-top
    if self.meta["model"]["name"] not in ("small_cnn", "lenet"):
      raise ValueError(f"keras_model needs an image model; {self.directory} holds a "
                       f"{self.meta['model']['name']}")
    if (silo is None) == (server is None):
      raise ValueError("keras_model takes one of silo and server")
    weights = self.silo_weights[silo] if server is None else self.server_weights[server]
    return cnn.to_keras(weights, self.meta["model"]["feature_shape"])

  def training_run(self, silos, seed: int):
    """A `simulation.Run` training on `silos` as this run trained (its method,
    settings, DP target and protocol; fresh keys from `seed`): LiRA's shadow models.
    ValueError for a run saved without its training settings."""
    from tff_silo import algorithms, simulation   # pylint: disable=g-import-not-at-top
    from tff_silo.privacy import PrivacyProtocol   # pylint: disable=g-import-not-at-top
    training = self.meta["info"].get("training")
    if not training:
      raise ValueError(f"{self.directory} cannot be retrained from its settings (a "
                       "d-private, two_cluster or custom-aggregator run)")
    settings = dict(training["definition"])
    name = settings.pop("name")
    settings.setdefault("num_silos", silos.num_silos)   # Mocha's K
    definition = algorithms.silo_definition(name, self.model(), silos.feature_shape,
                                            cluster_init_seed=seed, **settings)
    protocol = training["protocol"]
    return simulation.Run(
        definition, silos, target_epsilon=training["target_epsilon"],
        target_delta=training["target_delta"], seed=seed,
        protocol=None if protocol is None else PrivacyProtocol(**protocol))

  def check_data(self, silos) -> None:
    """ValueError unless `silos` are the very split the run trained and was tested
    on (its fingerprint): members are their training examples. A version-3 run
    needs the data-check key it was saved with (`data_key_path`)."""
    saved = self.meta["fingerprint"]
    if self.meta["version"] < 3:
      ours = _digests(silos, None)
    else:
      key = _data_key(create=False)
      if key is None or _key_id(key) != saved.get("key_id"):
        raise ValueError(f"{self.directory}'s data check is keyed by data-check key "
                         f"{saved.get('key_id')}, not found at {data_key_path()}: copy "
                         f"the key file of the machine that saved it there (or set "
                         f"{KEY_ENV})")
      ours = fingerprint(silos, key)
    if ours != saved:
      raise ValueError(f"the silos rebuilt from {self.directory}'s recipe differ from "
                       "those it trained on (fingerprint mismatch): another data file "
                       "or version")


def run_folder(parent: str, label: str, run_key: str) -> str:
  """The folder a binary saves a run in: `label` (method, settings) and a hash of
  the run key, so that different runs never share one."""
  return os.path.join(parent, f"{label}-" + hashlib.sha256(run_key.encode()).hexdigest()[:10])


def training_settings(definition: dict, *, target_epsilon=None, target_delta=None,
                      protocol=None) -> dict:
  """What `SavedRun.training_run` retrains with: `silo_definition`'s keyword
  arguments (`name` included) and the run's DP target and `PrivacyProtocol` (None
  without DP)."""
  return dict(definition=definition, target_epsilon=target_epsilon,
              target_delta=target_delta,
              protocol=None if protocol is None else dataclasses.asdict(protocol))


def model_spec(model, silos, **builder) -> dict:
  """How `build_model` rebuilds `model`: by default `models.model_for` of the silos'
  task and shape; `builder` names another with its keyword arguments
  (`linear_regression`: bias, objective; `small_cnn`: channels, hidden)."""
  spec = dict(name=model.name, task=silos.task,
              feature_shape=list(silos.feature_shape), num_classes=silos.num_classes,
              weight_shapes=[list(s) for s in model.weight_shapes])
  if builder:
    spec["builder"] = builder
  return spec


def build_model(spec: dict):
  from tff_silo import models   # pylint: disable=g-import-not-at-top
  builder = dict(spec.get("builder", {}))
  if builder:
    name = builder.pop("name")
    if name == "linear_regression":
      model = models.linear_regression(spec["feature_shape"][0], **builder)
    elif name == "small_cnn":
      model = models.small_cnn(tuple(spec["feature_shape"]), spec["num_classes"],
                               channels=tuple(builder["channels"]),
                               hidden=builder["hidden"])
    else:
      raise ValueError(f"unknown model builder {name!r} in a saved run")
  else:
    model = models.model_for(types.SimpleNamespace(
        task=spec["task"], feature_shape=tuple(spec["feature_shape"]),
        num_classes=spec["num_classes"]))
  if [list(s) for s in model.weight_shapes] != spec["weight_shapes"]:
    raise ValueError(f"the rebuilt {model.name} has weight shapes "
                     f"{model.weight_shapes}, the saved run {spec['weight_shapes']}")
  return model


def data_key_path() -> str:
  """Where the data-check key is kept: `$TFF_SILO_DATA_KEY`, default
  `~/.config/tff_silo/data-check.key`."""
  return os.environ.get(KEY_ENV) or os.path.join(os.path.expanduser("~"), ".config",
                                                 "tff_silo", "data-check.key")


def _data_key(create: bool) -> Optional[bytes]:
  """The data-check key; made (32 bytes of OS entropy, readable by its owner only)
  when missing and `create`, else None when missing."""
  path = data_key_path()
  if not os.path.exists(path):
    if not create:
      return None
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    try:
      handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:   # another process made it first
      pass
    else:
      with os.fdopen(handle, "wb") as f:
        f.write(secrets.token_bytes(_KEY_BYTES))
  try:
    with open(path, "rb") as f:
      key = f.read()
  except OSError as e:
    raise ValueError(f"the data-check key {path} cannot be read ({e.strerror})") from None
  if len(key) != _KEY_BYTES:
    raise ValueError(f"the data-check key {path} is not {_KEY_BYTES} bytes; remove it "
                     "to make a new one (runs saved with it can then not be checked)")
  return key


def _key_id(key: bytes) -> str:
  """A name for a key that tells nothing about it."""
  return hashlib.sha256(b"tff_silo data-check key id\0" + key).hexdigest()[:16]


def _digests(silos, key: Optional[bytes]) -> list:
  """Per silo, the HMAC-SHA-256 under `key` (plain SHA-256 when None, versions 1
  and 2) of its train and of its test arrays (x then y, dtype and shape first)."""
  def digest(*arrays):
    h = hashlib.sha256() if key is None else hmac.new(key, digestmod=hashlib.sha256)
    for a in arrays:
      a = np.ascontiguousarray(a)
      h.update(str((a.dtype.str, a.shape)).encode())
      h.update(a.tobytes())
    return h.hexdigest()
  return [dict(train=digest(x, y), test=digest(xt, yt)) for x, y, xt, yt in zip(
      silos.x_train, silos.y_train, silos.x_test, silos.y_test)]


def fingerprint(silos, key: Optional[bytes] = None) -> dict:
  """The keyed fingerprint of the silos' split (the data-check key by default,
  made on first use): {"scheme", "key_id", "silos": per silo train and test}."""
  key = _data_key(create=True) if key is None else key
  return dict(scheme="hmac-sha256", key_id=_key_id(key), silos=_digests(silos, key))


def privacy_summary(privacy) -> Optional[dict]:
  """The per-silo privacy of a `privacy.silo_accounts.SiloPrivacy` (None without DP)."""
  if privacy is None:
    return None
  return dict(unit="example", epsilon_spent=[float(e) for e in privacy.epsilon_spent],
              target_delta=[float(d) for d in privacy.target_delta],
              noise_multipliers=[float(z) for z in privacy.noise_multipliers],
              sampling_rates=[float(q) for q in privacy.sampling_rates],
              steps=[int(s) for s in privacy.steps],
              num_selections=int(privacy.num_selections),
              neighbouring=privacy.protocol.neighbouring, protocol=privacy.protocol.name,
              sampling=privacy.sampling, bounded=bool(privacy.bounded))


def user_level_privacy(settings, epsilon: float, delta: float, num_users: int) -> dict:
  """The privacy of a user-level DP run (`user_level.UserDPSettings`, UDP-Alg):
  every user's epsilon is the run's, for adding or removing one user's data, and
  covers phi and the noised aggregates only (`covers`): the embeddings, the silo
  weights (each user's generated model) and per-user metrics are `outside`; with W
  not public, `covers` says the epsilon does not hold."""
  return dict(unit="user", neighbouring="add_remove_user",
              epsilon_spent=[float(epsilon)] * num_users,
              target_delta=[float(delta)] * num_users,
              noise_multiplier=float(settings.noise_multiplier),
              sampling_rate=float(settings.sampling_rate),
              l2_norm_clip=float(settings.l2_norm_clip),
              weight_cap=settings.weight_cap,
              user_sizes_public=bool(settings.weight_cap is not None
                                     and settings.public_sizes),
              public_user_count=settings.public_user_count,
              covers=settings.covers,
              outside=["hypernetwork/embeddings", "silo weights (generated models)",
                       "per-user metrics"])


def _versions() -> dict:
  out = {}
  for package in ("tensorflow", "tensorflow-federated", "dp-accounting"):
    try:
      out[package] = metadata.version(package)
    except metadata.PackageNotFoundError:
      out[package] = None
  out["tff_silo"] = __version__
  return out


def save(directory: str, *, run_key: str, silo_weights, model: dict, data: dict,
         silos, privacy=None, info: Optional[dict] = None, server_weights=(),
         hypernetwork=None) -> bool:
  """Writes a run to `directory` (created); True if written, False if it already
  holds this run. ValueError if it holds another run.

  `privacy`: a `silo_accounts.SiloPrivacy` or a JSON-able dict (user-level runs);
  `server_weights`: the server's models; `hypernetwork`: (phi, embeddings), with
  `model["hypernetwork"]` its spec."""
  existing = os.path.join(directory, "run.json")
  if os.path.exists(existing):
    with open(existing) as f:
      held = json.load(f).get("run_key")
    if held == run_key:
      return False
    raise ValueError(f"{directory} holds another run; a saved run is never replaced")
  if os.path.exists(directory) and os.listdir(directory):
    raise ValueError(f"{directory} exists and is not a saved run; choose another folder")
  meta = dict(format=FORMAT, version=VERSION, run_key=run_key,
              saved=time.strftime("%Y-%m-%dT%H:%M:%S"), versions=_versions(),
              model=model, data=data, fingerprint=fingerprint(silos),
              privacy=privacy if isinstance(privacy, dict) else privacy_summary(privacy),
              info=info or {}, num_silos=len(silo_weights))
  if (hypernetwork is None) != ("hypernetwork" not in model):
    raise ValueError("a hypernetwork's weights and its spec (model['hypernetwork']) "
                     "are saved together")
  arrays = {f"silo/{k}/{i}": w for k, weights in enumerate(silo_weights)
            for i, w in enumerate(weights)}
  arrays.update({f"server/{g}/{i}": w for g, weights in enumerate(server_weights)
                 for i, w in enumerate(weights)})
  if hypernetwork is not None:
    phi, embeddings = hypernetwork
    arrays.update({f"hypernetwork/phi/{i}": p for i, p in enumerate(phi)})
    arrays["hypernetwork/embeddings"] = embeddings
  parent = os.path.dirname(os.path.abspath(directory))
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(dir=parent, prefix=".saving-")
  try:
    np.savez(os.path.join(staging, "weights.npz"),
             **{name: np.asarray(w, np.float32) for name, w in arrays.items()})
    with open(os.path.join(staging, "run.json"), "w") as f:
      json.dump(meta, f, indent=1, sort_keys=True)
    if os.path.exists(directory):
      os.rmdir(directory)   # empty (checked above)
    os.rename(staging, directory)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return True


def load(directory: str) -> SavedRun:
  """The run saved in `directory`; ValueError in one line for anything else (no
  run.json, another format, a version this code does not read)."""
  path = os.path.join(directory, "run.json")
  if not os.path.isfile(path):
    raise ValueError(f"{directory} is not a saved run (no run.json)")
  try:
    with open(path) as f:
      meta = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"{path} cannot be read as JSON ({e})") from None
  if not isinstance(meta, dict):
    raise ValueError(f"{path} is not a {FORMAT} file (not a JSON object)")
  if meta.get("format") != FORMAT:
    raise ValueError(f"{path} has \"format\": {meta.get('format')!r}, not {FORMAT!r}: "
                     "not a run saved by tff_silo")
  version = meta.get("version")
  if version not in READABLE_VERSIONS:
    raise ValueError(f"{path} has format version {version!r}; this tff_silo reads "
                     f"versions {', '.join(map(str, READABLE_VERSIONS))}")
  missing = [key for key in _REQUIRED if key not in meta]
  if missing:
    raise ValueError(f"{path} lacks {', '.join(map(repr, missing))}: damaged, or not "
                     "written by tff_silo.runs.save")
  weights = os.path.join(directory, "weights.npz")
  try:
    with np.load(weights) as arrays:
      stored = {name: arrays[name] for name in arrays.files}
  except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ValueError(f"{weights} is damaged or unreadable ({reason})") from None
  try:
    silo_weights, server_weights = _models(stored, "silo"), _models(stored, "server")
    hypernetwork = None
    if "hypernetwork/embeddings" in stored:
      phi = tuple(stored[f"hypernetwork/phi/{i}"] for i in range(
          sum(name.startswith("hypernetwork/phi/") for name in stored)))
      hypernetwork = (phi, stored["hypernetwork/embeddings"])
  except (KeyError, ValueError, IndexError):
    raise ValueError(f"{weights} does not hold the arrays of a saved run") from None
  if len(silo_weights) != meta.get("num_silos"):
    raise ValueError(f"{weights} holds {len(silo_weights)} silo models, run.json says "
                     f"{meta.get('num_silos')}")
  return SavedRun(directory, meta, silo_weights, server_weights, hypernetwork)


def _models(stored: dict, part: str) -> tuple:
  """The models stored as "<part>/<index>/<tensor>", in order."""
  count = {}
  for name in stored:
    fields = name.split("/")
    if fields[0] == part:
      count[int(fields[1])] = max(count.get(int(fields[1]), 0), int(fields[2]) + 1)
  return tuple(tuple(stored[f"{part}/{k}/{i}"] for i in range(count[k]))
               for k in range(len(count)))
