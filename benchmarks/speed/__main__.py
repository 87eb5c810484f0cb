"""`python -m benchmarks.speed`: the binary (`benchmarks.speed`'s `main`)."""

from absl import flags

from benchmarks import common, speed

__doc__ = speed.__doc__   # pylint: disable=redefined-builtin  (what --help prints)
flags.adopt_module_key_flags(speed)   # --help lists the binary's flags

if __name__ == "__main__":
  common.run_main(speed.main)
