"""saving.huggingface_repo_id (trainer/run/hub.py): 2-step runs that upload to a fake Hub on
127.0.0.1 (a small HTTP server answering the three calls huggingface_hub makes to upload:
create_repo, preupload, commit; and the three it makes to download what was committed: the
revision, the file tree, each file), one whose Hub fails, a run that resumes from a state it
uploaded (saving.resume_from_huggingface), and the token kept out of every file. Only this
module's runs leave offline mode, and only towards the fake endpoint."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.config.files import ConfigError, from_dict
from trainer.events import Finished, ListSink, Log, Step
from trainer.run.hub import parse_resume, repo_path
from trainer.run.loop import run

TOKEN = "hf_fakeTokenNeverWritten1234567890"
MAX_REQUESTS = 40


COMMIT = "1" * 40


class FakeHub:
    """Records what is committed and serves it back (one repository, one revision); ``fail``
    answers every call with HTTP 500."""

    def __init__(self, fail: bool = False):
        self.fail, self.calls, self.files, self.created = fail, [], {}, []
        self.reads: list[str] = []  # every GET / HEAD
        self.downloads: list[str] = []  # the files downloaded
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hub.calls.append((self.path, self.headers.get("authorization")))
                if hub.fail or len(hub.calls) > MAX_REQUESTS:
                    return self._answer(500, {"error": "the fake Hub fails"})
                return self._answer(200, hub.answer(self.path, body))

            def do_GET(self, head: bool = False):  # noqa: N802
                hub.reads.append(self.path)
                found = hub.serve(self.path)
                if hub.fail or found is None:
                    return self._answer(404, {"error": "not on the fake Hub"}, head)
                data, headers = found
                self._send(200, data, headers, head)

            def do_HEAD(self):  # noqa: N802
                self.do_GET(head=True)

            def _answer(self, code, payload, head=False):
                self._send(code, json.dumps(payload).encode(),
                           {"Content-Type": "application/json"}, head)

            def _send(self, code, data, headers, head=False):
                self.send_response(code)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str, body: bytes) -> dict:
        if path.startswith("/api/repos/create"):
            request = json.loads(body)
            self.created.append(request)
            return {"url": f"{self.url}/{request.get('organization')}/{request['name']}"}
        if "/preupload/" in path:
            files = json.loads(body)["files"]
            return {"files": [{"path": f["path"], "uploadMode": "regular",
                               "shouldIgnore": False} for f in files]}
        if "/commit/" in path:
            for line in body.splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    self.files[item["value"]["path"]] = base64.b64decode(
                        item["value"]["content"])
            repo = path.split("/api/models/")[1].split("/commit/")[0]
            return {"commitUrl": f"{self.url}/{repo}/commit/{'1' * 40}", "commitOid": "1" * 40}
        return {}

    def serve(self, path: str):
        """(bytes, headers) for huggingface_hub's download calls: the revision's info, the
        file tree and each file under /<repo>/resolve/<commit>/; None for anything else."""
        path = path.split("?")[0]
        api = "/api/models/" + "/".join(path.split("/")[3:5]) if path.startswith("/api/") else ""
        if api and path.startswith(api + "/revision/"):
            siblings = [{"rfilename": name} for name in self.files]
            return json.dumps({"id": api[12:], "sha": COMMIT, "siblings": siblings}).encode(), \
                {"Content-Type": "application/json"}
        if api and path.startswith(api + "/tree/"):
            tree = [{"type": "file", "path": name, "size": len(data),
                     "oid": hashlib.sha1(data).hexdigest()} for name, data in self.files.items()]
            return json.dumps(tree).encode(), {"Content-Type": "application/json"}
        parts = path.split("/", 5)  # '', owner, name, 'resolve', commit, file
        if len(parts) == 6 and parts[3] == "resolve" and parts[5] in self.files:
            self.downloads.append(parts[5])
            data = self.files[parts[5]]
            return data, {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                          "Content-Type": "application/octet-stream"}
        return None

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def online(monkeypatch, tmp_path):
    """Leave offline mode for this test only; huggingface_hub reads its endpoint per call."""
    import huggingface_hub.constants as hc

    def point_at(url: str) -> None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hc, "ENDPOINT", url)
        monkeypatch.setattr(hc, "HUGGINGFACE_CO_URL_TEMPLATE",  # the file URLs of downloads
                            url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))  # downloads stay in the test's
    cache = tmp_path / "hf-cache"
    return point_at


def hub_config(tmp_path: Path, **saving):
    data = one_image_dataset(tmp_path / "data")
    return from_dict(small_config(tmp_path, data, training={"max_train_steps": 2},
                                  saving={"output_name": "hubrun",
                                          "huggingface_repo_id": "me/tiny-lora", **saving}))


def logs(sink: ListSink) -> list[str]:
    return [e.message for e in sink.of(Log)]


def test_two_steps_upload_each_save_and_the_state(tmp_path, online):
    cfg = hub_config(tmp_path, save_every_n_steps=1, save_state=True,
                     save_state_to_huggingface=True, async_upload=True,
                     huggingface_path_in_repo="runs/a")
    sink = ListSink()
    with FakeHub() as hub:
        online(hub.url)
        run(cfg, sink)
    assert sink.of(Finished)[-1].status == "finished"
    out = Path(cfg.saving.output_dir)
    for name in ("hubrun-step00000001.safetensors", "hubrun.safetensors"):
        assert hub.files[f"runs/a/{name}"] == (out / name).read_bytes()
    state = "hubrun-step00000002-state"
    done = (out / state / "progress.json").read_bytes()
    assert hub.files[f"runs/a/{state}/progress.json"] == done
    assert f"runs/a/{state}/trained.safetensors" in hub.files
    assert hub.created[0]["visibility"] == "private" and hub.created[0]["name"] == "tiny-lora"
    assert all(auth == f"Bearer {TOKEN}" for _, auth in hub.calls)  # the token from HF_TOKEN
    assert len(hub.calls) <= MAX_REQUESTS
    # the token is in no file of the run: configs beside the files and in the states, metadata
    for path in out.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


def test_a_failing_hub_is_logged_and_the_run_finishes(tmp_path, online):
    cfg = hub_config(tmp_path)
    sink = ListSink()
    with FakeHub(fail=True) as hub:
        online(hub.url)
        run(cfg, sink)
    assert sink.of(Finished)[-1].status == "finished"
    assert (Path(cfg.saving.output_dir) / "hubrun.safetensors").is_file()
    failed = [m for m in logs(sink) if m.startswith("Upload to the Hub failed")]
    assert failed and "me/tiny-lora" in failed[0]
    assert len(hub.calls) <= 3


def test_no_repo_no_upload_and_the_options_need_one(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    for saving, needs in (({"async_upload": True}, "huggingface_repo_id"),
                          ({"save_state_to_huggingface": True}, "huggingface_repo_id"),
                          ({"save_state_to_huggingface": True,
                            "huggingface_repo_id": "me/x"}, "save_state")):
        with pytest.raises(ConfigError, match=needs):
            from_dict(small_config(tmp_path, data, saving=saving))
    with pytest.raises(ConfigError, match="huggingface_repo_id"):
        from_dict(small_config(tmp_path, data, saving={"huggingface_repo_id": "no slash"}))


def test_paths_and_the_resume_form_of_sd_scripts():
    sv = type("S", (), {"huggingface_path_in_repo": "/runs/"})
    assert repo_path(sv, "a.safetensors") == "runs/a.safetensors"
    sv.huggingface_path_in_repo = None
    assert repo_path(sv, "a.safetensors") == "a.safetensors"
    assert parse_resume("me/r/runs/x-state") == ("me/r", "runs/x-state", None, "model")
    assert parse_resume("me/r/x-state:main") == ("me/r", "x-state", "main", "model")
    assert parse_resume("me/r/x-state:v1:dataset") == ("me/r", "x-state", "v1", "dataset")
    with pytest.raises(ValueError, match="training.resume"):
        parse_resume("latest-state")


def test_import_kohya_maps_the_hub_keys_and_keeps_the_token_out(tmp_path):
    from trainer.config import files as config_io
    from trainer.importers.kohya import import_kohya

    cfg, report = import_kohya({
        "LoRA_type": "Standard", "save_state": True, "huggingface_repo_id": "me/lora",
        "huggingface_repo_type": "dataset", "huggingface_path_in_repo": "runs",
        "huggingface_token": TOKEN, "huggingface_repo_visibility": "",
        "save_state_to_huggingface": True, "resume_from_huggingface": False,
        "async_upload": True})
    sv = cfg.saving
    assert (sv.huggingface_repo_id, sv.huggingface_repo_type, sv.huggingface_path_in_repo,
            sv.huggingface_repo_visibility, sv.save_state_to_huggingface, sv.async_upload) == \
        ("me/lora", "dataset", "runs", "private", True, True)
    assert not report.unsupported
    assert [k for k, _ in report.not_needed] == ["huggingface_token"]
    config_io.save(cfg, tmp_path / "c.toml")
    assert TOKEN not in (tmp_path / "c.toml").read_text() and TOKEN not in report.text()
    cfg, _ = import_kohya({"LoRA_type": "Standard", "huggingface_repo_id": "me/lora",
                           "huggingface_repo_visibility": "public"})
    assert cfg.saving.huggingface_repo_visibility == "public"


def test_a_run_resumes_from_the_state_it_uploaded_to_the_hub(tmp_path, online):
    """sd-scripts' --resume_from_huggingface: training.resume = owner/name/<folder>; the state
    is downloaded (only its folder) and the run goes on from it, exactly as from the folder on
    disk: the final LoRA equals the one of the run that never stopped."""
    cfg = hub_config(tmp_path, save_every_n_steps=1, save_state=True,
                     save_state_to_huggingface=True, huggingface_path_in_repo="runs")
    with FakeHub() as hub:
        online(hub.url)
        whole = ListSink()
        run(cfg, whole)
        state = "runs/hubrun-step00000001-state"
        assert f"{state}/progress.json" in hub.files
        raw = cfg.model_dump(mode="json", exclude_none=True)
        raw["saving"].update(output_dir=str(tmp_path / "resumed"), huggingface_repo_id=None,
                             save_state_to_huggingface=False, resume_from_huggingface=True)
        raw["training"]["resume"] = f"me/tiny-lora/{state}"
        resumed = from_dict(raw)
        sink = ListSink()
        result = run(resumed, sink)
    assert result.status == "finished", result.error
    assert [e.step for e in sink.of(Step)] == [2]  # step 1 came from the Hub's state
    assert hub.downloads and all(name.startswith(state + "/") for name in hub.downloads)
    first = load_file(Path(cfg.saving.output_dir) / "hubrun.safetensors")
    second = load_file(result.output_path)
    assert first.keys() == second.keys() and all(first[k].equal(second[k]) for k in first)


def test_resume_from_huggingface_is_refused_without_a_hub_state_to_resume(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    cases = ((None, "saving.resume_from_huggingface downloads the state that training.resume "
                    "names"),
             ("latest", "training.resume = 'latest' looks for a state in saving.output_dir"),
             ("no-slash-state", "training.resume = 'no-slash-state': with "
                                "saving.resume_from_huggingface it names a state"),
             ("me/r/x-state:main:nope", "'model', 'dataset' or 'space', not 'nope'"))
    for resume, named in cases:
        training = {"resume": resume} if resume else {}
        with pytest.raises(ConfigError) as err:
            small_config(tmp_path, data, training=training,
                         saving={"resume_from_huggingface": True})
        assert named in str(err.value), (resume, str(err.value))
    cfg = small_config(tmp_path, data, training={"resume": "me/r/runs/x-state:v1"},
                       saving={"resume_from_huggingface": True})
    assert parse_resume(cfg.training.resume) == ("me/r", "runs/x-state", "v1", "model")


def test_import_kohya_reads_resume_from_huggingface_only_with_resume():
    from trainer.importers.kohya import import_kohya

    cfg, report = import_kohya({"LoRA_type": "Standard", "resume_from_huggingface": True,
                                "resume": ""})
    assert not cfg.saving.resume_from_huggingface and not report.unsupported
    assert dict(report.not_needed)["resume_from_huggingface"].startswith(
        "sd-scripts reads it only with resume")
    cfg, report = import_kohya({"LoRA_type": "Standard", "resume_from_huggingface": True,
                                "resume": "me/lora/runs/a-state"})
    assert cfg.saving.resume_from_huggingface and cfg.training.resume == "me/lora/runs/a-state"
    assert not report.unsupported and not report.not_needed
