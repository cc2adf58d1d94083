"""bench/compare_peers.py's own logic: the studio's side of the comparison is a valid config
with the peers' settings, the configurations --only / --precision select, the peers' commands
(resolution, precision, extra arguments), and the table's medians, ratios, goals and start-up
breakdown."""

import sys

import pytest

from trainer.config.files import from_dict
from trainer.config.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "bench"))
import compare_peers  # noqa: E402
import peer_runs  # noqa: E402


def test_the_studio_config_is_valid_and_matches_the_peers(tmp_path):
    cfg = from_dict(compare_peers.studio_config(tmp_path / "model", tmp_path / "data",
                                                tmp_path / "out", 30))
    assert (cfg.network.network_dim, cfg.network.network_alpha) == (8, 8.0)
    assert not cfg.network.train_text_encoder and cfg.dataset.resolution == 64
    assert (cfg.training.max_train_steps, cfg.training.mixed_precision) == (30, "no")
    assert cfg.optimizer.optimizer_type == "AdamW" and cfg.optimizer.learning_rate == 1e-4
    assert not cfg.dataset.enable_bucket  # every image resized to the one size, as the peers


@pytest.mark.parametrize("precision, expected", [("auto", "auto"), ("bf16", "bf16")])
def test_the_studio_config_at_256_px_and_as_installed(tmp_path, precision, expected):
    raw = compare_peers.studio_config(tmp_path / "model", tmp_path / "data", tmp_path / "out",
                                      20, resolution=256, precision=precision)
    if precision == "auto":  # as installed: the setting is left at the studio's default
        assert "mixed_precision" not in raw["training"]
    cfg = from_dict(raw)
    assert cfg.dataset.resolution == 256 and cfg.training.mixed_precision == expected


def test_only_and_precision_select_the_configurations():
    keys = [v.key for v in compare_peers.variants(
        ["sd-scripts", "diffusers", "studio:auto", "studio:bf16"], ["no", "bf16", "auto"])]
    assert keys == ["sd-scripts:no", "sd-scripts:bf16", "diffusers:no", "diffusers:bf16",
                    "studio:bf16", "studio:auto"]  # a peer has no auto
    labels = [v.label for v in compare_peers.variants(["sd-scripts", "studio"], ["no", "auto"])]
    assert labels == ["sd-scripts", "studio, fp32 (mixed_precision = no)",
                      "studio, as installed"]
    args = compare_peers.parse_args(["--resolution", "64,256", "--precision", "no,bf16",
                                     "--ss-args", "--xformers --foo 'a b'"])
    assert args.resolution == [64, 256] and args.ss_args == ["--xformers", "--foo", "a b"]
    with pytest.raises(SystemExit):
        compare_peers.parse_args(["--precision", "fp8"])
    with pytest.raises(SystemExit):
        compare_peers.parse_args(["--resolution", "100"])


def test_a_peer_command_takes_resolution_precision_steps_and_extra_args(tmp_path):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "cmd_ss.sh").write_text(
        '#!/bin/bash\nMODEL=$1; OUT=$2\nexec python train_network.py '
        '--resolution=${PEER_RESOLUTION:-64} --max_train_steps=30 '
        '--mixed_precision=${PEER_PRECISION:-no} --output_dir="$OUT" --output_name=lora\n')
    run = tmp_path / "run"
    run.mkdir()
    variant = compare_peers.Variant(compare_peers.SD_SCRIPTS, "bf16")
    cmd, env = compare_peers.command(variant, run, tmp_path / "model", tmp_path, scripts, 20,
                                     256, ["--foo", "a b"])
    assert env == {"PEER_RESOLUTION": "256", "PEER_PRECISION": "bf16"}
    text = (run / "cmd_ss.sh").read_text()
    assert "--max_train_steps=20 " in text and "--output_dir=\"$OUT\" --foo 'a b' " in text
    assert cmd == ["bash", str(run / "cmd_ss.sh"), str(tmp_path / "model"), str(run / "out")]
    studio = compare_peers.Variant(compare_peers.STUDIO, "auto")
    cmd, env = compare_peers.command(studio, run, tmp_path / "model", tmp_path, scripts, 20,
                                     256, ["--set", "training.full_bf16=true"])
    assert cmd[-3:] == [str(run / "studio.toml"), "--set", "training.full_bf16=true"]
    assert env == {} and 'resolution = 256' in (run / "studio.toml").read_text()


def test_medians_skip_warm_ups_and_ratios_and_goals_compare_the_tools():
    def result(tool, precision, rep, s, step1=5.0):
        return {"label": f"{tool} {precision}", "model": "sd15", "resolution": 256,
                "tool": tool, "precision": precision, "rep": rep, "rc": 0, "s_per_step": s,
                "peak_rss_mib": 100.0, "step1_s": step1}

    results = [result("sd-scripts", "no", 0, 9.0), result("sd-scripts", "no", 1, 3.0),
               result("sd-scripts", "no", 2, 3.6), result("sd-scripts", "no", 3, 2.4),
               result("sd-scripts", "bf16", 1, 2.0), result("diffusers", "no", 1, 2.0, 10.0),
               result("studio", "auto", 0, 9.0), result("studio", "auto", 1, 1.2, 5.0)]
    rows = {r["run"]: r for r in compare_peers.summary_rows(results)}
    assert rows["sd-scripts no"]["s_per_step"] == 3.0 and rows["sd-scripts no"]["reps"] == 3
    ratio = compare_peers.ratios(list(rows.values()))
    assert ratio["sd15 256 px: studio auto / sd-scripts s/step"] == 0.4
    assert ratio["sd15 256 px: studio auto / sd-scripts bf16 s/step"] == 0.6
    assert ratio["sd15 256 px: studio auto / diffusers start -> step 1"] == 0.5
    met = {text.split(" = ")[0]: ok for text, _, ok in compare_peers.goals(list(rows.values()))}
    assert met == {"sd15 256 px: studio:auto / sd-scripts:no s/step": True,
                   "sd15 256 px: studio:auto / sd-scripts:bf16 s/step": False,
                   "sd15 256 px: studio:auto / diffusers:no start -> step 1": True}


def test_the_studio_start_up_is_read_from_its_log_lines(tmp_path):
    lines = ["2.500\t0\tDevice: CPU · AMD EPYC; mixed precision: no",
             "2.501\t0\tCPU training with 2 thread(s), one fewer while ...",
             "6.000\t0\tBase model: /m (SD 1.x, epsilon, 512)",
             "9.000\t0\tPrecision auto: bf16 base weights (avx512_bf16; measured: ...)",
             "11.000\t0\tLatent cache ready: 16 image(s) encoded in 2.0s",
             "12.500\t0\t16 images, 160 with repeats; batch 1 x accumulation 1: 160 steps",
             "12.600\t0\t  0%|          | 0/20 [00:00<?, ?step/s]"]
    (tmp_path / "log.ts").write_text("\n".join(lines) + "\n")
    stages = compare_peers.startup(tmp_path, 15.0)
    assert stages == {"imports": 2.5, "data + model load": 3.5, "bf16 probe": 3.0,
                      "latent cache": 2.0, "text cache + set-up": 1.5, "first step": 2.5}
    notes = compare_peers.studio_notes(tmp_path)
    assert notes["threads"] == [2] and notes["precision_note"].startswith("Precision auto: bf16")
    (tmp_path / "log.ts").write_text("\n".join(lines[:3] + lines[4:]) + "\n")  # no probe line
    assert compare_peers.startup(tmp_path, 15.0)["bf16 probe"] is None
    assert compare_peers.startup(tmp_path, 15.0)["latent cache"] == 5.0


def test_the_studio_upscales_the_64_px_images_to_the_one_256_px_size_as_the_peers(tmp_path):
    from trainer.data.buckets import BucketSpec, assign_bucket, size_problem

    cfg = from_dict(compare_peers.studio_config(tmp_path / "model", tmp_path / "data",
                                                tmp_path / "out", 20, resolution=256))
    spec = BucketSpec.from_config(cfg.dataset)
    assert assign_bucket((64, 64), spec) == (256, 256) and size_problem((64, 64), spec) is None


def test_warm_ups_are_short_and_a_quiet_machine_can_be_told_by_its_cpu_use():
    args = compare_peers.parse_args(["--steps", "20"])
    assert (args.steps, args.warmup_steps, args.idle_cores) == (20, 4, None)
    busy = peer_runs.cpu_busy(0.2)
    assert busy is None or 0.0 <= busy <= (peer_runs.os.cpu_count() or 1) + 0.01
    assert peer_runs.wait_for_quiet(1e9, 0.0)  # below any load: at once
