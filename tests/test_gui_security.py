"""What the server exposes: no network listening without a login, a login that guards the API,
no monitoring endpoint, no analytics, and only the output folders served."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from gui_helpers import PROJECT, fake_run, gui_home, launched  # noqa: F401

from kohya_gui.__main__ import check_access, is_loopback, parse_args
from kohya_gui.app import build_app, default_output_dir
from kohya_gui.runner import Runner


def test_listening_on_the_network_without_a_login_refuses_to_start(gui_home):  # noqa: F811
    env = {**os.environ, "KOHYA_GUI_PASSWORD": ""}
    proc = subprocess.run([sys.executable, "-m", "kohya_gui", "--listen", "0.0.0.0",
                           "--port", "1"], cwd=PROJECT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a login" in proc.stderr
    assert "--username and --password" in proc.stderr


def test_the_command_starts_the_app_on_loopback(gui_home, tmp_path):  # noqa: F811
    from gui_helpers import studio_process

    with studio_process(tmp_path) as (_, url):
        assert "Kohya Studio" in httpx.get(url).text
        assert httpx.get(url + "monitoring").status_code in (403, 404)
        assert httpx.post(url + "gradio_api/call/state", json={"data": []}).status_code == 200
        assert (Path(gui_home) / "gradio_tmp").is_dir()


@pytest.mark.parametrize(("argv", "ok"), [
    ([], True),
    (["--listen", "localhost"], True),
    (["--listen", "::1"], True),
    (["--listen", "192.168.1.5"], False),
    (["--listen", "myhost.lan"], False),
    (["--listen", "0.0.0.0", "--username", "u", "--password", "p"], True),
    (["--username", "u"], False),
])
def test_access_rules(argv, ok, monkeypatch):
    monkeypatch.delenv("KOHYA_GUI_PASSWORD", raising=False)
    auth, problem = check_access(parse_args(argv))
    assert (problem is None) is ok, problem
    assert is_loopback("127.0.0.2") and not is_loopback("10.0.0.1")


@pytest.fixture(scope="module")
def open_app(gui_home):  # noqa: F811
    demo = build_app(Runner(fake_run(), write_config=False))
    yield demo, launched(demo)
    demo.runner.close()
    demo.close()


@pytest.fixture(scope="module")
def locked_app(gui_home):  # noqa: F811
    demo = build_app(Runner(fake_run(), write_config=False))
    args = parse_args(["--listen", "0.0.0.0", "--username", "ann", "--password", "s3cret"])
    auth, problem = check_access(args)
    assert problem is None
    yield demo, launched(demo, listen=args.listen, auth=auth)
    demo.runner.close()
    demo.close()


def test_the_login_guards_the_api(locked_app):
    _, url = locked_app
    for path in ("gradio_api/info", "config", "gradio_api/file=/etc/hostname"):
        response = httpx.get(url + path)
        assert response.status_code == 401, path
    assert httpx.post(url + "gradio_api/call/state", json={"data": []}).status_code == 401
    with httpx.Client() as client:
        login = client.post(url + "login", data={"username": "ann", "password": "s3cret"})
        assert login.status_code == 200
        assert client.get(url + "gradio_api/info").status_code == 200
        assert client.get(url + "monitoring").status_code in (403, 404)


def test_no_monitoring_and_no_analytics(open_app):
    demo, url = open_app
    for path in ("monitoring", "monitoring/summary", "monitoring/anykey",
                 "gradio_api/monitoring"):
        response = httpx.get(url + path)
        assert response.status_code in (403, 404), path  # 403: "Monitoring is not enabled."
        assert "monitoring URL" not in response.text
    assert demo.enable_monitoring is False and demo.analytics_enabled is False


def test_only_the_output_folders_are_served(open_app, gui_home, tmp_path):  # noqa: F811
    demo, url = open_app
    assert demo.allowed_paths == [default_output_dir()]
    assert httpx.get(url + "gradio_api/file=/etc/passwd").status_code == 403
    secret = Path(gui_home) / "secret.txt"
    secret.write_text("not for the web")
    assert httpx.get(url + f"gradio_api/file={secret}").status_code == 403
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("no")
    assert httpx.get(url + f"gradio_api/file={outside}").status_code == 403
    cfg_dir = tmp_path / "run-out"
    from trainer.config import files as config_io

    demo.runner.submit(config_io.from_dict({"saving": {"output_dir": str(cfg_dir)}}))
    assert demo.runner.wait_idle(60)
    produced = cfg_dir / "last.safetensors"
    assert produced.is_file()
    assert httpx.get(url + f"gradio_api/file={produced}").status_code == 200
    assert str(cfg_dir.resolve()) in demo.allowed_paths
    upload_dir = Path(os.environ["GRADIO_TEMP_DIR"])
    assert upload_dir.is_relative_to(Path(gui_home)) and upload_dir.name == "gradio_tmp"
