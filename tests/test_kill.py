"""kill -9 at random moments never leaves a broken file, and 'latest' resumes exactly.

Two trials of bench/kill_trials.py (which runs twenty for the figures in the closing note)."""

import sys

from trainer.config.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "bench"))

import kill_trials  # noqa: E402


def test_sigkill_during_training_and_saves(tmp_path, tiny_model_dir):
    lines = []
    totals = kill_trials.trials(2, seed=1, folder=tmp_path,
                                data=kill_trials.sample_data(tmp_path / "data"),
                                report=lines.append, max_delay=1.5)
    assert totals == {"trials": 2, "killed_mid_run": 2, "corrupt": 0, "resumed_equal": 2}, lines
