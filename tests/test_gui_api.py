"""The app through its API (gradio_client), in-process on a free port: the default preset runs to
completion and the final state says so; bad config is refused naming the field; a second job
waits in the queue and can be cancelled."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradio_client import Client
from gui_helpers import (  # noqa: F401
    QUICK_STEPS,
    gui_home,
    launched,
    one_torch_thread,
    quick_overrides,
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
