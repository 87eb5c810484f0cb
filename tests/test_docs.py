"""The numbers the README quotes come from what the commands print now (issue 54,
item 4: docs that cannot go stale)."""

import os
import re

import pytest

from tests import binaries

README = os.path.join(binaries.ROOT, "README.md")


def _readme() -> str:
  with open(README) as f:
    return " ".join(f.read().split())   # line breaks as spaces


@pytest.mark.cli
@pytest.mark.slow
def test_the_readme_quotes_what_the_main_job_prints(tmp_path):
  done = binaries.run("compare", f"--output_dir={tmp_path}")
  assert done.returncode == 0, done.stderr[-2000:]
  beats = re.search(r"mrmtl beats fedavg in (\d+) of (\d+), local in (\d+) of (\d+)",
                    done.stdout)
  means = dict(re.findall(r"^\| (local|mrmtl) \| ([\d.]+) \+-", done.stdout, re.M))
  fedavg, cells, local, _ = beats.groups()
  gain = round(100 * (1 - float(means["mrmtl"]) / float(means["local"])))
  readme = _readme()
  assert (f"MR-MTL beats FedAvg in {fedavg} of {cells} private cells and local "
          f"training in {local} of {cells} (by {gain}% at epsilon 2: "
          f"{means['mrmtl']} against {means['local']} MSE)") in readme
  assert f"quick preset: {fedavg}/{cells} and {local}/{cells} private cells" in readme
