"""bench/compare_peers.py's own logic: the studio's side of the comparison is a valid config
with the peers' settings, and the table's medians and ratios come out right."""

import sys

from trainer.config.files import from_dict
from trainer.config.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "bench"))
import compare_peers  # noqa: E402


def test_the_studio_config_is_valid_and_matches_the_peers(tmp_path):
    cfg = from_dict(compare_peers.studio_config(tmp_path / "model", tmp_path / "data",
                                                tmp_path / "out", 30))
    assert (cfg.network.network_dim, cfg.network.network_alpha) == (8, 8.0)
    assert not cfg.network.train_text_encoder and cfg.dataset.resolution == 64
    assert (cfg.training.max_train_steps, cfg.training.mixed_precision) == (30, "no")
    assert cfg.optimizer.optimizer_type == "AdamW" and cfg.optimizer.learning_rate == 1e-4


def test_medians_skip_warm_ups_and_ratios_compare_the_tools():
    def result(tool, rep, s):
        return {"label": tool, "model": "sd15", "tool": tool, "rep": rep, "rc": 0,
                "s_per_step": s, "peak_rss_mib": 100.0, "step1_s": 5.0}

    results = [result("sd-scripts", 0, 9.0), result("sd-scripts", 1, 1.0),
               result("sd-scripts", 2, 1.2), result("sd-scripts", 3, 0.8),
               result("diffusers", 1, 2.0), result("studio", 0, 9.0), result("studio", 1, 0.5)]
    rows = {r["run"]: r for r in compare_peers.summary_rows(results)}
    assert rows["sd-scripts"]["s_per_step"] == 1.0 and rows["sd-scripts"]["reps"] == 3
    ratio = compare_peers.ratios(list(rows.values()))
    assert ratio["sd15: studio / sd-scripts s/step"] == 0.5
    assert ratio["sd15: studio / diffusers steps/s"] == 4.0
