"""Config files from strangers (issue 22): malformed JSON/TOML, a 50 MB file, deep nesting,
numbers that overflow and strings where numbers belong, given to `import-kohya`, `train`
(the config), the GUI's presets and config files, and the dataset TOML: one error each, naming
the file, never a traceback; and the GUI's uploads are size-limited."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gui_helpers import gui_home  # noqa: F401

from trainer import cli

BIG = 50 * 2**20


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


TOML_CASES = {  # name -> (text, words of the one error)
    "malformed TOML": ("[training\nmax_train_steps = 3", "not valid TOML"),
    "50 MB file": (None, "MB"),
    "deep nesting": ("[training]\nx = " + "[" * 100_000 + "]" * 100_000, "nested"),
    "overflowing float": ("[optimizer]\nlearning_rate = 1e999", "not a finite number"),
    "overflowing integer": ("[training]\nmax_train_steps = 99999999999999999999999999999",
                            "too large"),
    "string for a number": ('[training]\nmax_train_steps = "many"', "max_train_steps"),
    "not UTF-8": (b"[training]\nmax_train_steps = 3 # \xff\xfe", "not UTF-8"),
}
JSON_CASES = {
    "malformed JSON": ('{"learning_rate": 1e-4,', "not valid JSON"),
    "50 MB file": (None, "MB"),
    "deep nesting": ('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested"),
    "overflowing float": ('{"LoRA_type": "Standard", "learning_rate": 1e999}',
                          "not a finite number"),
    "overflowing integer": ('{"LoRA_type": "Standard", '
                            '"max_train_steps": 99999999999999999999999999999}', "too large"),
    "string for a number": ('{"LoRA_type": "Standard", "learning_rate": "fast"}',
                            "learning_rate"),
    "not UTF-8": (b'{"learning_rate": "\xff"}', "not UTF-8"),
}
DATASET_CASES = {
    "malformed TOML": ("[[datasets]\n", "not valid TOML"),
    "50 MB file": (None, "MB"),
    "deep nesting": ("x = " + "[" * 100_000 + "]" * 100_000, "nested"),
    "overflowing integer": ("[general]\nresolution = 99999999999999999999999999999",
                            "too large"),
    "string for a number": ('[general]\nresolution = "big"', "resolution"),
}


def big_file(path: Path, kind: str) -> Path:
    filler = ("# " + "x" * 1000 + "\n") if kind == "toml" else " " * 1024
    with path.open("w") as f:
        if kind == "json":
            f.write('{"a": 1')
        for _ in range(BIG // len(filler) + 1):
            f.write(filler)
        if kind == "json":
            f.write("}")
    return path


def table_row(kind: str, case: str, message: str, code: int) -> None:
    out = Path(__file__).parent / "artifacts"
    out.mkdir(exist_ok=True)
    with (out / "config_file_cases.md").open("a") as f:
        f.write(f"| {kind}: {case} | {message[:300]} | {code} |\n")


def one_error(captured) -> str:
    assert "Traceback" not in captured.err + captured.out
    errors = [ln for ln in captured.err.splitlines() if ln.startswith("error")]
    assert len(errors) == 1, captured.err
    return errors[0] + "".join(
        " " + ln.strip() for ln in captured.err.splitlines()[1:] if ln.startswith("  "))


@pytest.mark.parametrize("case", list(TOML_CASES))
def test_train_config(case, tmp_path, capsys):
    text, words = TOML_CASES[case]
    path = big_file(tmp_path / "cfg.toml", "toml") if text is None else write(
        tmp_path / "cfg.toml", text)
    code = cli.main(["train", str(path)])
    message = one_error(capsys.readouterr())
    assert code == 2 and str(path) in message and words in message, message
    table_row("train CONFIG", case, message, code)


@pytest.mark.parametrize("case", list(JSON_CASES))
def test_import_kohya(case, tmp_path, capsys):
    text, words = JSON_CASES[case]
    path = big_file(tmp_path / "k.json", "json") if text is None else write(
        tmp_path / "k.json", text)
    code = cli.main(["import-kohya", str(path), "-o", str(tmp_path / "out.toml")])
    message = one_error(capsys.readouterr())
    assert code == 2 and "k.json" in message and words in message, message
    assert not (tmp_path / "out.toml").exists()
    table_row("import-kohya", case, message, code)


@pytest.mark.parametrize("case", list(TOML_CASES))
def test_gui_config_file_and_preset(case, tmp_path, gui_home):  # noqa: F811
    from kohya_gui.fields import Form
    from kohya_gui.tabs import mode_tab

    text, words = TOML_CASES[case]
    path = big_file(tmp_path / "p.toml", "toml") if text is None else write(
        tmp_path / "p.toml", text)
    values, message = mode_tab.load_config_file(Form("lora"), str(path))
    assert values is None and words in message and message.count("\n- ") == 1, message


@pytest.mark.parametrize("case", list(JSON_CASES))
def test_gui_kohya_upload(case, tmp_path, gui_home):  # noqa: F811
    from kohya_gui.fields import Form
    from kohya_gui.kohya_import import load_kohya_config

    text, words = JSON_CASES[case]
    path = big_file(tmp_path / "k.json", "json") if text is None else write(
        tmp_path / "k.json", text)
    values, message = load_kohya_config(Form("lora"), str(path))
    assert values is None and words in message and message.count("\n- ") == 1, message


@pytest.mark.parametrize("case", list(DATASET_CASES))
def test_dataset_toml(case, tmp_path, capsys):
    text, words = DATASET_CASES[case]
    path = big_file(tmp_path / "ds.toml", "toml") if text is None else write(
        tmp_path / "ds.toml", text)
    cfg = write(tmp_path / "cfg.toml", f"[dataset]\ndataset_config = {json.dumps(str(path))}\n"
                f"[saving]\noutput_dir = {json.dumps(str(tmp_path / 'out'))}\n")
    code = cli.main(["train", str(cfg)])
    message = one_error(capsys.readouterr())
    assert code in (1, 2) and "ds.toml" in message and words in message, message
    table_row("dataset TOML", case, message, code)


def test_gui_uploads_are_size_limited(gui_home, tmp_path):  # noqa: F811
    import httpx
    from gui_helpers import fake_run, launched

    from kohya_gui.app import build_app
    from kohya_gui.runner import Runner

    demo = build_app(Runner(fake_run(), write_config=False))
    url = launched(demo)
    try:
        big = b"{" + b" " * (2 * 2**20) + b"}"
        response = httpx.post(url + "gradio_api/upload", files={"files": ("k.json", big)},
                              timeout=30)
        assert response.status_code == 413, response.text
        small = httpx.post(url + "gradio_api/upload", files={"files": ("k.json", b"{}")},
                           timeout=30)
        assert small.status_code == 200
    finally:
        demo.runner.close()
        demo.close()
