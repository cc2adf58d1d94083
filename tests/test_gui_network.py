"""Reachable from the network (issue 22): with a login, every route of the app (walked from the
app itself, Gradio's API included) refuses an unauthenticated request, failed logins are
rate-limited and logged, and the credentials can come from the environment or a file; without a
login, a Host that is not the server's own and a state-changing request from another site get
403 (DNS rebinding and cross-site requests). Every request here goes to 127.0.0.1."""

from __future__ import annotations

import logging
import os
import re

import httpx
import pytest
from gui_helpers import (  # noqa: F401
    CHROMIUM,
    CHROMIUM_ARGS,
    PAGE_TIMEOUT_MS,
    PROJECT,
    fake_run,
    free_port,
    gui_home,
    launched,
    studio_process,
    wait_for,
)

from kohya_gui import guard
from kohya_gui.__main__ import check_access, parse_args
from kohya_gui.app import build_app
from kohya_gui.runner import Runner

USER, PASSWORD = "ann", "s3cret-pw"
PARAMS = {"path": "x", "path_or_url": "x", "api_name": "state", "event_id": "x",
          "session_hash": "x", "size": "32", "key": "x", "id": "x", "environment": "x",
          "type": "x", "file_name": "x", "url_path": "x", "run": "0", "component_id": "1",
          "segment_id": "0", "ext": "ts", "endpoint": "x", "record_id": "x", "asset_id": "x",
          "page": "x"}


def walk_routes(routes, prefix: str = ""):
    """(path, methods) of every route, into included routers and mounts."""
    for route in routes:
        if hasattr(route, "effective_candidates"):  # fastapi's included router
            yield from walk_routes(route.effective_candidates(), prefix)
        elif getattr(route, "routes", None) is not None and not getattr(route, "methods", None):
            yield from walk_routes(route.routes, prefix + getattr(route, "path", ""))
        elif getattr(route, "path", None):
            yield prefix + route.path, sorted(getattr(route, "methods", None) or {"GET"})


def concrete(path: str) -> str:
    return re.sub(r"\{(\w+)(:[^}]*)?\}", lambda m: PARAMS.get(m.group(1), "x"), path)


@pytest.fixture(scope="module")
def locked(gui_home):  # noqa: F811
    demo = build_app(Runner(fake_run(), write_config=False))
    url = launched(demo, auth=(USER, PASSWORD))
    yield demo, url
    demo.runner.close()
    demo.close()


@pytest.fixture(scope="module")
def open_app(gui_home):  # noqa: F811
    demo = build_app(Runner(fake_run(), write_config=False))
    url = launched(demo, allowed_hosts=("studio.lan",))
    yield demo, url
    demo.runner.close()
    demo.close()


def test_every_route_refuses_an_unauthenticated_request(locked):
    demo, url = locked
    routes = sorted(set((p, m) for p, ms in walk_routes(demo.server_app.routes) for m in ms))
    assert len(routes) > 60, routes  # the walk reached Gradio's API router
    assert any(p.startswith("/gradio_api/call/") for p, _ in routes)
    public = []
    with httpx.Client(timeout=10) as client:
        for path, method in routes:
            if method == "HEAD":
                continue
            response = client.request(method, url.rstrip("/") + concrete(path))
            if guard.is_public(concrete(path)):
                public.append(path)
                assert response.status_code != 500, path
                continue
            assert response.status_code == 401, (method, path, response.status_code)
    # what stays reachable is the login page and files that hold nothing of the studio
    assert set(public) <= {"/", "/login", "/login/", "/favicon.ico", "/theme.css",
                           "/gradio_api/theme.css", "/robots.txt", "/manifest.json",
                           "/pwa_icon", "/pwa_icon/{size}", "/assets/{path:path}",
                           "/static/{path:path}", "/svelte/{path:path}"}, public
    page = httpx.get(url)
    assert page.status_code == 200 and "training-panel" not in page.text
    config = re.search(r"window.gradio_config = (\{.*?\});</script>", page.text, re.S)
    assert config and '"auth_required":true' in config.group(1)
    assert '"components":[]' in config.group(1) and '"dependencies":[]' in config.group(1)


def test_a_login_opens_the_routes(locked):
    _, url = locked
    with httpx.Client(timeout=10) as client:
        assert client.post(url + "login",
                           data={"username": USER, "password": PASSWORD}).status_code == 200
        assert client.get(url + "gradio_api/info").status_code == 200
        assert client.post(url + "gradio_api/call/state", json={"data": []}).status_code == 200
        assert "training-panel" in client.get(url + "config").text


def test_failed_logins_are_rate_limited_and_logged(gui_home, caplog):  # noqa: F811
    demo = build_app(Runner(fake_run(), write_config=False))
    url = launched(demo, auth=(USER, PASSWORD))
    try:
        with caplog.at_level(logging.WARNING, logger="kohya_gui.guard"):
            codes = [httpx.post(url + "login", data={"username": USER, "password": "guess"},
                                timeout=10).status_code for _ in range(guard.LOGIN_ATTEMPTS)]
            assert codes == [400] * guard.LOGIN_ATTEMPTS
            blocked = httpx.post(url + "login", data={"username": USER, "password": PASSWORD},
                                 timeout=10)
        assert blocked.status_code == 429 and "Too many failed logins" in blocked.text
        assert int(blocked.headers["retry-after"]) > 0
        messages = [r.getMessage() for r in caplog.records]
        failures = [m for m in messages if m.startswith("failed login")]
        assert len(failures) == guard.LOGIN_ATTEMPTS and "127.0.0.1" in failures[-1]
        assert any("refused" in r.getMessage() for r in caplog.records)
    finally:
        demo.runner.close()
        demo.close()


def test_the_limiter_forgets_after_its_window():
    limiter = guard.LoginLimiter(attempts=5, window_s=60)
    for i in range(5):
        limiter.failed("10.0.0.9", now=100.0 + i)
    assert limiter.wait_s("10.0.0.9", now=105.0) == pytest.approx(55.0)
    assert limiter.wait_s("10.0.0.8", now=105.0) == 0  # per address
    assert limiter.wait_s("10.0.0.9", now=161.0) == 0


def test_credentials_from_the_environment_or_a_file(monkeypatch, tmp_path):
    monkeypatch.setenv("KOHYA_GUI_USERNAME", "env-user")
    monkeypatch.setenv("KOHYA_GUI_PASSWORD", "env-pw")
    auth, problem = check_access(parse_args(["--listen", "0.0.0.0"]))
    assert problem is None and auth == ("env-user", "env-pw")
    monkeypatch.delenv("KOHYA_GUI_USERNAME")
    monkeypatch.delenv("KOHYA_GUI_PASSWORD")
    secret = tmp_path / "login"
    secret.write_text("file-user:pass:with:colons\n")
    auth, problem = check_access(parse_args(["--listen", "0.0.0.0", "--auth-file", str(secret)]))
    assert problem is None and auth == ("file-user", "pass:with:colons")
    secret.write_text("no colon here")
    _, problem = check_access(parse_args(["--listen", "0.0.0.0", "--auth-file", str(secret)]))
    assert "username:password" in problem
    _, problem = check_access(parse_args(["--auth-file", str(tmp_path / "missing")]))
    assert "cannot read it" in problem


def test_the_command_reads_the_password_from_the_environment(gui_home, tmp_path):  # noqa: F811
    """The password is nowhere in the command line (ps), and the login works."""
    env = {**os.environ, "KOHYA_GUI_USERNAME": USER, "KOHYA_GUI_PASSWORD": PASSWORD}
    with studio_process(tmp_path, env) as (proc, url):
        assert PASSWORD not in " ".join(proc.args)
        assert httpx.post(url + "gradio_api/call/state", json={"data": []}).status_code == 401
        with httpx.Client() as client:
            assert client.post(url + "login", data={"username": USER,
                                                    "password": PASSWORD}).status_code == 200
            assert client.post(url + "gradio_api/call/state",
                               json={"data": []}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example",
                                  "localhost.evil.example:{port}", "10.0.0.1:{port}", ""])
def test_a_foreign_host_header_is_refused(open_app, host):
    _, url = open_app
    port = url.rstrip("/").rsplit(":", 1)[1]
    headers = {"Host": host.format(port=port)}
    with httpx.Client(timeout=10) as client:
        for method, path, body in (("GET", "", None), ("GET", "config", None),
                                   ("POST", "gradio_api/call/doctor", {"data": []}),
                                   ("POST", "gradio_api/call/state", {"data": []})):
            response = client.request(method, url + path, headers=headers, json=body)
            assert response.status_code == 403, (method, path, response.status_code)
            assert "--allowed-host" in response.text


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}",
                                  "LOCALHOST:{port}", "studio.lan:{port}", "127.0.0.1"])
def test_the_servers_own_names_pass(open_app, host):
    _, url = open_app
    port = url.rstrip("/").rsplit(":", 1)[1]
    response = httpx.post(url + "gradio_api/call/state", json={"data": []},
                          headers={"Host": host.format(port=port)}, timeout=10)
    assert response.status_code == 200, response.text


def test_a_request_from_another_site_is_refused(open_app):
    _, url = open_app
    port = url.rstrip("/").rsplit(":", 1)[1]
    call = url + "gradio_api/call/state"
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null",
                   f"http://localhost:{port}", "http://127.0.0.1:1"):
        response = httpx.post(call, json={"data": []}, headers={"Origin": origin}, timeout=10)
        assert response.status_code == 403, origin  # Host is 127.0.0.1:port
        assert "cross-site" in response.text
    ok = httpx.post(call, json={"data": []}, headers={"Origin": url.rstrip("/")}, timeout=10)
    assert ok.status_code == 200
    ok = httpx.post(call, json={"data": []}, timeout=10)  # scripts send no Origin
    assert ok.status_code == 200
    ok = httpx.post(call, json={"data": []}, headers={"Origin": f"http://studio.lan:{port}"},
                    timeout=10)
    assert ok.status_code == 200  # an --allowed-host
    page = httpx.get(url, headers={"Origin": "http://evil.example"}, timeout=10)
    assert page.status_code == 200  # reading the page from elsewhere is what CORS governs
    assert "access-control-allow-origin" not in page.headers


def test_the_host_rules():
    settings = guard.GuardSettings(listen="192.168.1.5", allowed_hosts=("studio.lan",))
    for host in ("localhost", "127.0.0.1:7860", "[::1]:7860", "[0:0::1]", "192.168.1.5:80",
                 "studio.lan", "STUDIO.LAN:7860"):
        assert guard.allowed_host(host, settings), host
    for host in ("", "evil", "192.168.1.6", "studio.lan.evil", "[::2]"):
        assert not guard.allowed_host(host, settings), host
    assert not guard.GuardSettings(login=True).check_host


@pytest.mark.browser
def test_the_login_page_works_in_a_browser(locked):
    from playwright.sync_api import sync_playwright

    _, url = locked
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(PAGE_TIMEOUT_MS)
            page.goto(url)
            page.get_by_label("username").fill(USER)
            page.get_by_label("password").fill(PASSWORD)
            page.get_by_role("button", name="Login").click()
            page.wait_for_selector("#training-panel")
            page.wait_for_selector('#progress .ks-status[data-status="idle"]')
        finally:
            browser.close()
