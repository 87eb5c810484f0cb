"""Every bad input a user gave the binaries (issue 16, ../shared/BAD_INPUT_CASES.md)
ends in one line on stderr naming the flag or file, a non-zero exit, no traceback,
before any training, with no TFF worker left.

One subprocess per binary runs all its cases in one interpreter (`_DRIVER`): flags
are reset between cases, and the functions that train or time anything are replaced
by one that raises, so a case that would start training fails the test."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cli   # every test here starts a binary

from tests.binaries import ROOT  # the repository

# The functions of each binary that start training (or timing) when called.
TRAINING = {
    "run": ["_simulate"],
    "hypernet": ["_run_hypernet", "_run_fedavg"],
    "attacks": ["_attack_rows", "_mia_train"],
    "speed": ["fresh.fresh_run", "fresh.speed_child"],   # (modules of the package)
    "summarize": [],
}

_DRIVER = r"""
import contextlib, importlib, io, json, sys, traceback
binary, cases_file, training = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
from absl import flags
from benchmarks import common
from tff_silo import runtime
module = importlib.import_module("benchmarks." + binary)

class TrainingStarted(BaseException):
  pass

def refuse(*args, **kwargs):
  raise TrainingStarted()

for name in filter(None, training):
  where, _, name = name.rpartition(".")
  setattr(importlib.import_module(".".join(filter(None, (module.__name__, where)))),
          name, refuse)
results = []
for args in json.load(open(cases_file)):
  flags.FLAGS.unparse_flags()
  sys.argv = [binary, *args]
  err, code, trained = io.StringIO(), 0, False
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    try:
      common.run_main(module.main)
    except SystemExit as e:
      code = e.code
    except TrainingStarted:
      trained = True
    except BaseException:
      traceback.print_exc()
      code = "exception"
  results.append(dict(args=args, code=code, stderr=err.getvalue(), trained=trained,
                      workers=len(runtime._children_named(runtime.WORKER_NAME))))
print(json.dumps(results))
"""


def _files(tmp_path):
  """Bad files of every kind the cases name."""
  f = {}
  def write(name, content):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)
  f["dir"] = str(tmp_path)
  f["empty_csv"] = write("empty.csv", b"")
  f["garbage_csv"] = write("garbage.csv", bytes(range(256)) * 4)
  f["foreign_csv"] = write("foreign.csv", "a,b,c\n1,2,3\n")
  f["unterminated_csv"] = write("half.csv", 'run_key,algorithm,test_metric\n"{"x": 1,a')
  f["run_csv"] = write("run.csv", 'run_key,algorithm,test_metric\nk,fedavg,0.5\n')
  f["extra_fields_csv"] = write("extra.csv",
                                'run_key,algorithm,test_metric\nk,fedavg,0.5,cpu\n')
  f["hypernet_csv"] = write("hn.csv", "run_key,algorithm,mean_user_accuracy\nk,hn,0.5\n")
  f["header_only_csv"] = write("header.csv", ",".join(
      ["dataset", "algorithm", "lam", "epsilon", "seed", "test_metric", "train_metric",
       "epsilon_spent_max", "noise_multiplier_mean", "wall_seconds", "metric"]) + "\n")
  f["empty_mat"] = write("empty_mat/school.mat", b"")
  f["garbage_mat"] = write("garbage_mat/school.mat", b"\x00\x13garbage!!")
  f["vehicle_users_number"] = write("vehicle_a/vehicle_train_ditto.json",
                                    json.dumps({"users": 5, "user_data": {}}))
  f["vehicle_data_list"] = write("vehicle_b/vehicle_train_ditto.json",
                                 json.dumps({"users": ["u"], "user_data": [1, 2]}))
  f["vehicle_ragged"] = write("vehicle_c/vehicle_train_ditto.json", json.dumps(
      {"users": ["u"], "user_data": {"u": {"x": [[1, 2], [3]], "y": [1, -1]}}}))
  f["vehicle_one_example"] = write("vehicle_e/vehicle_train_ditto.json", json.dumps(
      {"users": ["u", "v"], "user_data": {"u": {"x": [[1.0, 2.0]], "y": [1]},
                                          "v": {"x": [[1.0, 2.0]] * 4, "y": [1, -1] * 2}}}))
  f["vehicle_bad_bytes"] = write("vehicle_d/vehicle_train_ditto.json", b"\xff\xfe{")
  f["cifar_garbage"] = write("cifar/cifar-10-batches-py/data_batch_1", b"not a pickle")
  f["a_file"] = write("a_file.txt", "x")
  f["empty_folder"] = str(tmp_path / "nothing")
  os.makedirs(f["empty_folder"], exist_ok=True)
  return f


def _cases(binary, f):
  """(arguments, what the one line must contain) of every bad input of `binary`."""
  out = f"--output={f['dir']}/rows.csv"
  folder = lambda key: os.path.dirname(f[key])
  if binary == "run":
    school = ["--dataset=school", "--rounds=1"]
    return [
        (["--algorithm=local"], "--algorithm is now --methods"),
        (["--lam=1"], "--lam is now --lams"),
        (["--output=/proc/x/y.csv"], "--output /proc/x/y.csv: its folder cannot be"),
        ([f"--output={f['dir']}"], "is a directory"),
        ([f"--output_dir={f['a_file']}"], "--output_dir must name a folder"),
        (["--output_dir=/proc/x"], "--output /proc/x/run.csv: its folder cannot be"),
        ([f"--output={f['a_file']}/y.csv"], "its folder cannot be created"),
        ([f"--output={f['empty_csv']}"], "is an empty file"),
        ([f"--output={f['empty_csv']}", "--noresume"], "is an empty file"),
        ([f"--output={f['garbage_csv']}"], "cannot be read as a CSV"),
        ([f"--output={f['unterminated_csv']}"], "ends in the middle of a row"),
        ([f"--output={f['extra_fields_csv']}"], "has rows with more fields than its "
         "header's 3"),
        ([f"--output={f['foreign_csv']}"], "holds other rows than this binary's"),
        ([f"--output={f['hypernet_csv']}"], "no test_metric column"),
        ([*school, f"--data_dir={folder('empty_mat')}", out], "not a readable MATLAB"),
        ([*school, f"--data_dir={folder('garbage_mat')}", out], "not a readable MATLAB"),
        ([*school, f"--data_dir={f['empty_folder']}", out], "data file not found"),
        (["--dataset=vehicle", f"--data_dir={folder('vehicle_users_number')}", out],
         "expected a LEAF-style object"),
        (["--dataset=vehicle", f"--data_dir={folder('vehicle_data_list')}", out],
         "expected a LEAF-style object"),
        (["--dataset=vehicle", f"--data_dir={folder('vehicle_ragged')}", out],
         "user 'u' has non-numeric or ragged data"),
        (["--dataset=vehicle", f"--data_dir={folder('vehicle_bad_bytes')}", out],
         "is not valid JSON"),
        (["--lr=inf", out], "--lr must be a finite number"),
        (["--shards=-1", out], "--shards must be in [0, 4096]; got -1"),
        (["--epsilon=2", "--accountant=moments", out], "--accountant must be one of"),
        (["--epsilon=2", "--accountant=pld", "--neighbouring=replace_one", out],
         "--accountant=pld accounts add_remove (Poisson) DP-SGD only"),
        (["--accountant=pld", out], "--accountant applies to private runs only"),
        (["--shards=2", "--backend=tff", out], "--shards runs on the vectorized "
         "backend, not --backend=tff"),
        (["--dataset=synthetic", "--shards=99", out], "--shards=99 is more than the "),
        (["--dataset=synthetic", "--methods=mocha", "--shards=2", out],
         "mocha cannot run sharded"),
        (["--epsilon=1", "--clip=inf", out], "--clip must be a finite number"),
        (["--epsilon=1e300", out], "--epsilon must be at most 1000"),
        (["--epsilon=nan", out], "--epsilon must be a finite number"),
        (["--methods=dprivate_clustering", "--nu=1", "--leakage_cap=nan", out],
         "--leakage_cap must be a finite number"),
        (["--methods=fedavg", "--nu=1", out], "--nu applies to"),
        (["--methods=fedavg", "--num_clusters=2", out], "--num_clusters applies to"),
        (["--methods=fedavg", "--kmeans_iterations=0", out],
         "--kmeans_iterations applies to"),
        (["--methods=fedavg", "--lams=1", out], "--lams applies to"),
        (["--methods=local", "--selection_fraction=0.5", out],
         "--selection_fraction applies to"),
        (["--delta=1e-5", out], "--delta applies to private runs only"),
        (["--clip=1", out], "--clip applies to private runs only"),
        (["--sampling=poisson", out], "--sampling applies to private runs only"),
        ([f"--data_dir={f['dir']}", out], "--data_dir applies to --dataset=school"),
        (["--dataset=synthetic", "--mask_probability=0.2", out],
         "--mask_probability applies to --dataset=digits"),
        (["--methods=mrmtl,mrmtl", out], "--methods lists mrmtl twice"),
        (["--lams=1,1", out], "--lams lists 1.0 twice"),
        (["--seeds=0,0", out], "--seeds lists 0 twice"),
        (["--seeds=-1", out], "--seeds must be integers >= 0"),
        (["--eval_every=-1", f"--output={f['run_csv']}"], "--eval_every must be >= 0"),
        (["--methods=local,ifca", "--num_clusters=100", out],
         "--num_clusters=100 is more than the 40 silos"),
        (["stray", out], "unexpected arguments: stray"),
        (["--methods=finetune", "--finetune_fraction=2", out], "--finetune_fraction"),
        (["--epsilon=1e-300", out], "--epsilon must be at least 0.001"),
        (["--batch_size=100000", out], "--batch_size=100000 is larger than every silo"),
        (["--dataset=vehicle", f"--data_dir={folder('vehicle_one_example')}", out],
         "vehicle: silo 0: a silo with 1 example(s) cannot be split"),
        (["--dataset=school", "--rounds=1", f"--data_dir={folder('vehicle_one_example')}",
          out], "data file not found"),
    ]
  if binary == "hypernet":
    tiny = ["--num_users=4", "--rounds=1", out]
    return [
        (["stray", *tiny], "unexpected arguments: stray"),
        (["--algorithm=fedavg", *tiny], "--algorithm is now --methods"),
        (["--client_lr=0.1", *tiny], "--client_lr is now --lr"),
        (["--sampling_rate=0.1", *tiny], "--sampling_rate is now --sampling_rates"),
        (["--l2_norm_clip=0.1", *tiny], "--l2_norm_clip is now --clips"),
        (["--noise_multiplier=1", *tiny], "--noise_multiplier is now --noise_multipliers"),
        (["--output=/proc/x/y.csv"], "its folder cannot be created"),
        ([f"--output={f['dir']}"], "is a directory"),
        ([f"--output={f['garbage_csv']}"], "cannot be read as a CSV"),
        ([f"--output={f['run_csv']}"], "no mean_user_accuracy column"),
        ([f"--output_dir={f['a_file']}"], "--output_dir must name a folder"),
        (["--plot=/proc/x/p.png", *tiny], "--plot /proc/x/p.png: its folder"),
        (["--plot=figure.txt", *tiny], "--plot figure.txt must end in one of"),
        (["--dataset=femnist", f"--cache_dir={f['empty_folder']}", *tiny],
         "EMNIST file not found"),
        (["--dataset=femnist", f"--cache_dir={f['a_file']}", *tiny],
         "--cache_dir"),
        (["--dataset=cifar10", f"--data_dir={f['empty_folder']}", *tiny],
         "CIFAR-10 file not found"),
        (["--dataset=cifar10", f"--data_dir={folder('cifar_garbage')}/..", *tiny],
         "is not a CIFAR-10 python batch"),
        (["--sampling_rates=", *tiny], "--sampling_rates is empty: give at least one value"),
        (["--noise_multipliers=", *tiny], "--noise_multipliers is empty: give at least one"),
        (["--lr=inf", *tiny], "--lr must be a finite number"),
        (["--hypernet_lr=inf", *tiny], "--hypernet_lr must be a finite number"),
        (["--embedding_dim=0", *tiny], "--embedding_dim must be >= 1"),
        ([f"--cache_dir={f['dir']}", *tiny], "--cache_dir applies to --dataset=femnist"),
        ([f"--data_dir={f['dir']}", *tiny], "--data_dir applies to --dataset=fmnist,cifar10"),
        (["--seeds=0,0", *tiny], "--seeds lists 0 twice"),
        (["--methods=hypernet,hypernet", *tiny], "--methods lists hypernet twice"),
        (["--noise_multipliers=1,1", "--clips=1", *tiny],
         "--noise_multipliers lists 1.0 twice"),
        (["--methods=fedavg", "--hypernet_lr=0.2", *tiny], "--hypernet_lr applies to"),
        (["--delta=1e-3", *tiny], "--delta applies to noised runs only"),
    ]
  if binary == "summarize":
    return [
        ([], "give one or more CSV files"),
        ([f["empty_csv"]], "is an empty file"),
        ([f["garbage_csv"]], "cannot be read as a CSV"),
        ([f["foreign_csv"]], "holds other rows than this binary's"),
        ([f["hypernet_csv"]], "holds other rows than this binary's"),
        ([f["unterminated_csv"]], "ends in the middle of a row"),
        ([f["extra_fields_csv"]], "has rows with more fields than its header's 3"),
        ([f"{f['dir']}/missing.csv"], "no such file"),
        (["--plot=/proc/x/p.png", f["run_csv"]], "--plot /proc/x/p.png: its folder"),
        (["--plot=table.xyz", f["run_csv"]], "--plot table.xyz must end in one of"),
        (["--plot=name", f["run_csv"]], "--plot name must end in one of"),
        ([f["header_only_csv"]], "hold(s) no rows"),
        (["--paired=mrmtl", f["run_csv"]], "--paired takes pairs a:b of two methods"),
        (["--paired=mrmtl:mrmtl", f["run_csv"]], "--paired takes pairs a:b"),
        (["--ci=normal", f["run_csv"]], "--ci must be one of t, bootstrap; got normal"),
    ]
  if binary == "speed":
    return [
        (["--parts=hypernet", "--rounds=0", out], "--rounds must be >= 1"),
        (["--parts=hypernet", "--repeats=0", out], "--repeats must be >= 1"),
        (["--parts=hypernet", "--repeats=-1", out], "--repeats must be >= 1"),
        (["--parts=hypernet", f"--output={f['dir']}"], "is a directory"),
        (["--parts=hypernet", f"--output={f['run_csv']}"], "no part, backend"),
        (["--parts=hypernet", f"--output={f['foreign_csv']}"], "holds other rows"),
        (["--parts=school", f"--data_dir={folder('empty_mat')}/none", out],
         "--data_dir must be a folder with school.mat"),
        (["--parts=hypernet", "stray", out], "unexpected arguments: stray"),
        (["--parts=hypernet,hypernet", out], "--parts lists hypernet twice"),
    ]
  mia = f"--mia_output={f['dir']}/mia.csv"
  figures = f"--figures_dir={f['dir']}/figures"
  both = [out, mia, figures]
  return [
      (["stray", *both], "unexpected arguments: stray"),
      (["--figures=x", out, mia], "--figures is now --figures_dir"),
      (["--client_lr=0.1", *both], "--client_lr is now --lr"),
      (["--method=idlg", *both], "--method is now --methods"),
      (["--defense=none", *both], "--defense is now --defenses"),
      (["--nu=1", *both], "--nu is now --nus"),
      (["--mia_algorithm=local", *both], "--mia_algorithm is now --mia_methods"),
      (["--mia_epsilon=1", *both], "--mia_epsilon is now --mia_epsilons"),
      (["--mia_attack=threshold", *both], "--mia_attack is now --mia_attacks"),
      (["--mia_lam=nan", *both], "--mia_lam must be a finite number"),
      (["--mia_lam=inf", *both], "--mia_lam must be a finite number"),
      (["--attack_lr=inf", *both], "--attack_lr must be a finite number"),
      (["--lr=inf", *both], "--lr must be a finite number"),
      (["--clip=inf", *both], "--clip must be a finite number"),
      (["--nus=inf", *both], "--nus must hold finite numbers"),
      (["--noise_multipliers=inf", *both], "--noise_multipliers must hold finite"),
      (["--nus=", *both], "--nus is empty: give at least one value"),
      (["--noise_multipliers=", *both], "--noise_multipliers is empty: give at least one"),
      (["--seed=-1", *both], "--seed must be >= 0"),
      (["--methods=idlg,idlg", *both], "--methods lists idlg twice"),
      (["--mia_epsilons=inf,inf", *both], "--mia_epsilons lists inf twice"),
      ([f"--output={f['dir']}", mia, figures], "is a directory"),
      ([out, f"--mia_output={f['dir']}", figures], "--mia_output"),
      ([out, mia, f"--figures_dir={f['a_file']}"], "--figures_dir"),
      ([f"--output={f['garbage_csv']}", mia, figures], "cannot be read as a CSV"),
      ([f"--output={f['run_csv']}", mia, figures], "no method, psnr column"),
      (["--dataset=cifar10", f"--data_dir={f['empty_folder']}", "--parts=inversion",
        out, figures], "CIFAR-10 file not found"),
      ([f"--data_dir={f['dir']}", *both], "--data_dir applies to --dataset=cifar10"),
  ]


@pytest.mark.parametrize("binary", sorted(TRAINING))
def test_every_bad_input_ends_in_one_line_before_any_work(binary, tmp_path):
  cases = _cases(binary, _files(tmp_path))
  cases_file = tmp_path / "cases.json"
  cases_file.write_text(json.dumps([args for args, _ in cases]))
  done = subprocess.run(
      [sys.executable, "-c", _DRIVER, binary, str(cases_file), ",".join(TRAINING[binary])],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "HOME": str(tmp_path)})
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads(done.stdout.strip().splitlines()[-1])
  failures = []
  for (args, expected), result in zip(cases, results):
    lines = result["stderr"].strip().splitlines()
    if (result["code"] in (0, None, "exception") or result["trained"]
        or result["workers"] or len(lines) != 1 or expected not in lines[0]
        or "Traceback" in result["stderr"]):
      failures.append(f"{args}: exit {result['code']}, trained {result['trained']}, "
                      f"stderr {result['stderr'].strip()[-600:]!r}, want {expected!r}")
  print(f"{binary}: {len(cases)} bad-input cases")
  assert not failures, "\n".join(failures)
  assert len(results) == len(cases)


@pytest.mark.parametrize("binary, flag", [
    ("run", "--methods=sgd"), ("compare", "--preset=mnist"),
    ("pandemic", "--profile=bogus"), ("hypernet", "--methods=sgd"),
    ("attacks", "--methods=sgd")])
def test_a_bad_flag_is_refused_before_tensorflow_loads(binary, flag):
  """The one-line error arrives without TensorFlow's import (seconds, and its
  start-up lines) before it."""
  script = ("import runpy, sys\n"
            f"sys.argv = ['{binary}', '{flag}']\n"
            "try:\n"
            f"  runpy.run_module('benchmarks.{binary}', run_name='__main__')\n"
            "except SystemExit as e:\n"
            "  print('exit', e.code, 'tensorflow' in sys.modules)\n")
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
  assert proc.stdout.strip() == "exit 2 False", (proc.stdout, proc.stderr[-1000:])
