"""The plan runner (`benchmarks.plan`): resume, stacking, atomic appends, errors."""

import pandas as pd
import pytest

from benchmarks import common, plan


def _runs(n):
  return [plan.Run(f"key{i}", f"run {i}", i) for i in range(n)]


def _row(run, value=None):
  return dict(run_key=run.key, value=run.spec if value is None else value)


def test_consecutive_groups_equal_neighbours_and_keeps_none_alone():
  items = [("a", 1), ("a", 2), ("b", 3), (None, 4), (None, 5), ("a", 6)]
  groups = plan.consecutive(items, lambda item: item[0])
  assert [[i for _, i in g] for g in groups] == [[1, 2], [3], [4], [5], [6]]


def test_pending_runs_execute_in_stacks_and_rows_come_back_in_plan_order(tmp_path):
  out = str(tmp_path / "rows.csv")
  seen = []

  def run_batch(batch, progress):
    seen.append([run.spec for run in batch])
    return [_row(run) for run in batch]

  rows = plan.Plan(_runs(5), output=out).execute(run_batch,
                                                 stack_key=lambda run: run.spec < 3)
  assert seen == [[0, 1, 2], [3, 4]]
  assert [row["value"] for row in rows] == [0, 1, 2, 3, 4]
  assert list(pd.read_csv(out).value) == [0, 1, 2, 3, 4]


def test_a_second_plan_skips_what_is_in_the_output_and_runs_the_rest(tmp_path, capsys):
  out = str(tmp_path / "rows.csv")
  plan.Plan(_runs(2), output=out).execute(lambda b, p: [_row(r) for r in b])
  ran = []

  def run_batch(batch, progress):
    ran.extend(run.spec for run in batch)
    return [_row(run, value=10 + run.spec) for run in batch]

  todo = plan.Plan(_runs(3), output=out)
  assert [run.key for run in todo.pending] == ["key2"]
  rows = todo.execute(run_batch)
  assert ran == [2] and [row["value"] for row in rows] == [0, 1, 12]
  assert capsys.readouterr().err.count(": already in") == 2
  # --noresume runs everything again, and appends
  assert len(plan.Plan(_runs(3), output=out, resume=False).pending) == 3


def test_many_skipped_runs_are_reported_in_one_line(tmp_path, capsys):
  out = str(tmp_path / "rows.csv")
  many = _runs(21)
  assert plan.MAX_SKIP_LINES < 21
  plan.Plan(many, output=out).execute(lambda b, p: [_row(r) for r in b])
  capsys.readouterr()
  assert plan.Plan(many, output=out).pending == []
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and "21 of 21 runs already in" in err


def test_a_run_with_several_rows_appends_them_all_and_returns_them(tmp_path):
  out = str(tmp_path / "rows.csv")
  rows = plan.Plan(_runs(2), output=out).execute(
      lambda batch, p: [[_row(run, 0), _row(run, 1)] for run in batch])
  assert len(rows) == 4 and len(pd.read_csv(out)) == 4
  assert plan.Plan(_runs(2), output=out).pending == []


def test_a_failing_batch_keeps_the_rows_before_it_and_ends_in_a_usage_error(tmp_path):
  out = str(tmp_path / "rows.csv")

  def run_batch(batch, progress):
    if batch[0].spec == 1:
      raise ValueError("the silos are too small for --batch_size=64")
    return [_row(run) for run in batch]

  with pytest.raises(common.UsageError, match="too small"):
    plan.Plan(_runs(3), output=out).execute(run_batch)
  assert list(pd.read_csv(out).run_key) == ["key0"]


def test_progress_is_given_with_rounds_and_a_summary_line_follows_each_batch(
    tmp_path, capsys):
  calls = []

  def run_batch(batch, progress):
    progress(2, 2, 0.5)
    calls.append(progress)
    return [_row(run) for run in batch]

  plan.Plan(_runs(2), output=str(tmp_path / "r.csv")).execute(
      run_batch, rounds=2, summary=lambda rows: f"value {rows[0]['value']}")
  err = capsys.readouterr().err
  assert "[1/2] run 0: round 2/2" in err and "[2/2] run 1: value 1; 2/2 runs done" in err
  assert "~" in err.splitlines()[1]   # time left after the first of two batches


def test_rows_under_another_runs_key_are_refused(tmp_path):
  with pytest.raises(RuntimeError, match="another run's key"):
    plan.Plan(_runs(1), output=str(tmp_path / "r.csv")).execute(
        lambda batch, p: [dict(run_key="other")])
  with pytest.raises(RuntimeError, match="share a run key"):
    plan.Plan(_runs(1) * 2, output=str(tmp_path / "r.csv"))
