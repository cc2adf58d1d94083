"""The benches of the studio against diffusers' examples (bench/vs_example.py,
bench/example_procs.py, bench/flux2_klein_lora_vs_diffusers.py): both tools' progress lines
read as step times, a measured process's output and memory, the rounds alternating the tools,
and the FLUX.2 bench training the same layers in both tools under the same settings."""

import sys
from types import SimpleNamespace

from trainer.config.files import from_dict
from trainer.config.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "bench"))
import example_procs  # noqa: E402
import flux2_klein_lora_vs_diffusers as flux2_bench  # noqa: E402
import vs_example  # noqa: E402


def test_both_tools_progress_lines_give_the_step_times():
    diffusers = [(1.0, "Steps:   0%|          | 0/3 [00:00<?, ?it/s]"),
                 (9.5, "Steps:  33%|###3      | 1/3 [00:08<00:17, 8.50s/it]"),
                 (9.6, "Steps:  33%|###3      | 1/3 [00:08<00:17, 8.50s/it, loss=1.39]"),
                 (17.0, "Steps:  67%|######6   | 2/3 [00:16<00:08, 8.10s/it, loss=1.38]")]
    studio = [(3.0, "Device: CPU"), (12.0, "1/3 (33%), 0.01 step/s, epoch 1, loss 1.39"),
              (20.5, "2/3 (66%), 0.01 step/s, epoch 1, loss 1.38"),
              (29.0, "3/3 (100%), 0.01 step/s, epoch 1, loss 1.38")]
    assert vs_example.step_times(diffusers, "diffusers", 3) == {0: 1.0, 1: 9.5, 2: 17.0}
    assert vs_example.step_times(studio, "studio", 3) == {1: 12.0, 2: 20.5, 3: 29.0}
    run = {"rc": 0, "wall_s": 30.0, "load_before": 0.5, "segments": studio,
           "tree_peak": 3 * 2**30, "maxrss": 2**30}
    summary = vs_example.summarize(run, "studio", 3)
    assert summary["step1_s"] == 12.0 and summary["steps"] == [8.5, 8.5]
    assert summary["s_per_step"] == 8.5 and summary["peak_gib"] == 3.0


def test_a_measured_process_gives_its_stamped_output_and_its_peak_memory(tmp_path):
    child = ("import sys, time; block = bytearray(200 * 2**20); sys.stdout.write('1/2 (50%)\\r');"
             "sys.stdout.flush(); time.sleep(0.3); print('2/2 (100%)'); sys.exit(3)")
    run = example_procs.run_measured([sys.executable, "-c", child], str(tmp_path), {},
                                     tmp_path / "run.log", timeout=60)
    assert run["rc"] == 3
    assert [text for _, text in run["segments"]] == ["1/2 (50%)", "2/2 (100%)"]
    assert run["segments"][1][0] - run["segments"][0][0] >= 0.25
    assert max(run["tree_peak"], run["maxrss"]) >= 200 * 2**20
    assert (tmp_path / "run.log").read_bytes() == b"1/2 (50%)\r2/2 (100%)\n"


def test_the_rounds_alternate_the_tools(tmp_path):
    order = []
    args = SimpleNamespace(only="diffusers,studio", warmup=True, reps=2, work=str(tmp_path),
                           runs_tag="t_")

    def one_run(tool, rep):
        order.append((tool, rep))
        return {"rc": 0, "s_per_step": float(len(order))}

    done = vs_example.rounds(args, one_run)
    assert order == [("diffusers", "warmup"), ("studio", "warmup"), ("diffusers", "1"),
                     ("studio", "1"), ("diffusers", "2"), ("studio", "2")]
    assert [r["s_per_step"] for r in done["studio"]] == [4.0, 6.0]  # the warm-up not counted
    assert (tmp_path / "t_results.json").is_file()


def test_the_flux2_bench_trains_the_same_layers_with_the_same_settings(tmp_path):
    from trainer.families.flux2.lora import part_modules
    from trainer.families.flux2.tiny import _transformer

    transformer = _transformer()  # klein's module names, 2 double and 2 single blocks
    linear = {n for n, m in transformer.named_modules() if type(m).__name__ == "Linear"}
    # peft's rule for a target list: the module's name is the entry or ends with "." + entry
    targets = flux2_bench.lora_layers(single=2).split(",")
    example = {n for n in linear if any(n == t or n.endswith("." + t) for t in targets)}
    studio = {path for paths in part_modules(transformer).values() for path in paths}
    assert example == studio and len(studio) == 2 * 12 + 2 * 2

    cmd = flux2_bench.example_cmd(SimpleNamespace(df_python="py", example="ex", steps=5,
                                                  df_args=[]),
                                  tmp_path / "m", tmp_path / "img", tmp_path / "o", 2)
    joined = " ".join(cmd)
    assert "--text_encoder_out_layers 9 18 27 " in joined  # the klein pipeline's, not 10 20 30
    for flag in ("--rank=4", "--lora_alpha=4", "--resolution=256", "--learning_rate=1e-4",
                 "--max_train_steps=5", "--seed=42", "--mixed_precision=no",
                 "--max_sequence_length=512", "--train_batch_size=1"):
        assert flag in cmd
    cfg = from_dict(vs_example.studio_config(tmp_path / "m", tmp_path / "d", tmp_path / "o", 5))
    assert (cfg.network.network_dim, cfg.network.network_alpha) == (4, 4.0)
    assert (cfg.dataset.resolution, cfg.dataset.enable_bucket) == (256, False)
    assert (cfg.training.max_train_steps, cfg.training.seed) == (5, 42)
    assert (cfg.training.mixed_precision, cfg.training.train_batch_size) == ("no", 1)
    assert cfg.optimizer.optimizer_type == "AdamW" and cfg.optimizer.learning_rate == 1e-4
    assert not cfg.network.train_text_encoder


def test_studio_settings_reach_the_studio_s_command_line(tmp_path):
    """--studio-set KEY=VALUE (repeated) becomes the studio's --set overrides, which its
    command line reads as settings."""
    import argparse

    from trainer.config.files import apply_overrides

    parser = argparse.ArgumentParser()
    vs_example.add_arguments(parser, "x.py", str(tmp_path))
    args = parser.parse_args(["--example", str(tmp_path), "--studio-set", "training.compile=true",
                              "--studio-set", "training.compile_scope=regional"])
    cmd = vs_example.studio_cmd(args, {"mode": "lora"}, tmp_path / "out")
    sets = [a.removeprefix("--set=") for a in cmd if a.startswith("--set=")]
    assert apply_overrides({}, sets) == {"training": {"compile": True,
                                                      "compile_scope": "regional"}}
