"""The app through its API (gradio_client), in-process on a free port: the default preset runs to
completion and the final state says so; bad config is refused naming the field; a second job
waits in the queue and can be cancelled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gradio_client import Client
from gui_helpers import (  # noqa: F401
    QUICK_STEPS,
    gui_home,
    launched,
    one_torch_thread,
    quick_overrides,
    sample_control,
    wait_for,
)

from kohya_gui.app import build_app
from kohya_gui.runner import TERMINAL


@pytest.fixture(scope="module")
def app(gui_home):  # noqa: F811
    demo = build_app()
    url = launched(demo)
    yield demo, url
    demo.runner.close()
    demo.close()


def state_of(client: Client, job_id: str) -> dict | None:
    state = client.predict(api_name="/state")
    return state if state["job_id"] == job_id and state["status"] in TERMINAL else None


def test_the_default_preset_trains_to_the_end(app, one_torch_thread, tmp_path):  # noqa: F811
    _, url = app
    client = Client(url, verbose=False)
    toml = client.predict("lora", "default", api_name="/preset_toml")
    assert "[saving]" in toml and "default-lora" in toml
    answer = client.predict(toml, quick_overrides(tmp_path / "out"), api_name="/train_toml")
    assert answer["ok"] and answer["status"] == "running", answer
    final = wait_for(lambda: state_of(client, answer["job_id"]), timeout=300, every=0.5)
    assert final["status"] == "finished", final["error"]
    assert final["step"] == final["total"] == QUICK_STEPS
    assert len(final["loss"]) == len(final["smoothed"]) == QUICK_STEPS
    assert Path(final["output_path"]) == tmp_path / "out" / "default-lora.safetensors"
    assert Path(final["output_path"]).is_file() and Path(final["config_path"]).is_file()
    other_tab = Client(url, verbose=False)  # a second page sees the same job
    assert other_tab.predict(api_name="/state")["job_id"] == answer["job_id"]


def test_an_edit_sample_comes_with_its_control(app, one_torch_thread, tmp_path):  # noqa: F811
    """FLUX.1 Kontext's tiny twin with a sample prompt that takes a control (--ci): the state
    names the sample's control, and the page's gallery draws the sample beside it."""
    from PIL import Image

    from kohya_gui.panel import render

    _, url = app
    client = Client(url, verbose=False)
    control = sample_control()
    toml = client.predict("lora", "tiny-flux-kontext", api_name="/preset_toml")
    prompt = f"add a red circle --ci {control} --s 2"
    overrides = quick_overrides(tmp_path / "out", steps=2) + [
        f"sampling.sample_prompts=[{json.dumps(prompt)}]", "sampling.sample_every_n_steps=2"]
    answer = client.predict(toml, overrides, api_name="/train_toml")
    assert answer["ok"], answer
    final = wait_for(lambda: state_of(client, answer["job_id"]), timeout=300, every=0.5)
    assert final["status"] == "finished", final["error"]
    [sample] = final["samples"]
    assert sample["prompts"] == ["add a red circle"] and sample["controls"] == [[str(control)]]
    parts = {k: k for k in ("progress", "log", "output", "error", "plot", "queue",
                            "cancel_choice", "gallery", "compare", "resume_choice", "seen")}
    [shown] = render(final, {}, parts)["gallery"].value  # what the page is sent
    assert shown["caption"] == "step 2: add a red circle (left: its control)"
    with Image.open(sample["paths"][0]) as img, Image.open(shown["image"]["path"]) as pair, \
            Image.open(control) as ref:
        assert pair.height == img.height and pair.width > img.width  # the control on its left
        left, want = pair.convert("RGB").getpixel((2, 2)), ref.convert("RGB").getpixel((2, 2))
        assert max(abs(a - b) for a, b in zip(left, want)) < 8  # as sent: lossy WebP


def test_bad_config_is_refused_by_field(app):
    _, url = app
    client = Client(url, verbose=False)
    answer = client.predict("[optimizer]\nlearning_rate = 0\n", [], api_name="/train_toml")
    assert answer["ok"] is False
    assert any("optimizer.learning_rate" in p for p in answer["problems"])
    answer = client.predict("[optimizer]\nlearning_rat = 1e-4\n", [], api_name="/train_toml")
    assert "did you mean 'optimizer.learning_rate'" in answer["problems"][0]
    answer = client.predict('mode = "textual_inversion"\n', [], api_name="/train_toml")
    assert "network.token_string is required" in answer["problems"][0]


def test_a_second_job_waits_and_can_be_cancelled(app, tmp_path):
    demo, url = app
    client = Client(url, verbose=False)
    toml = client.predict("lora", "default", api_name="/preset_toml")
    long_job = quick_overrides(tmp_path / "a", steps=10_000)
    first = client.predict(toml, long_job, api_name="/train_toml")
    second = client.predict(toml, quick_overrides(tmp_path / "b"), api_name="/train_toml")
    assert second["status"] == "queued" and second["position"] == 1, second
    queue = client.predict(api_name="/state")["queue"]
    assert [q["job_id"] for q in queue] == [second["job_id"]]
    assert client.predict(second["job_id"], api_name="/cancel") == f"{second['job_id']} cancelled"
    assert "stopping" in client.predict(api_name="/stop")
    final = wait_for(lambda: state_of(client, first["job_id"]), timeout=300, every=0.5)
    assert final["status"] == "stopped" and final["queue"] == []
    assert not (tmp_path / "b").exists()
