"""The escapes that put text from strangers into Markdown and HTML components (issue 22)."""

from __future__ import annotations

import json

from kohya_gui import kohya_import
from kohya_gui.safe_text import clean_metadata, code_block, cut, html_text, md
from trainer.tools.metadata_view import shown, training_facts, training_tags

SCRIPT = "<img src=x onerror=alert(1)>"


def test_md_leaves_no_markup():
    text = md(SCRIPT + " [a](javascript:x) ![i](y) **b** `c` # h $$x$$ http://e.example")
    assert "<" not in text and "](" not in text and "**" not in text and "`c`" not in text
    assert "$$" not in text and "http://" not in text and "# h" in text
    assert md("a\nb") == "a b" and md("x" * 1000, 20).endswith("...")
    assert md("# title").startswith("\\#") and md("optimizer.learning_rate") == \
        "optimizer.learning_rate"


def test_cut_and_html_text():
    assert cut("x" * 500, 10) == "xxxxxxx..." and cut("\x1b[31mred") == "\ufffd[31mred"
    assert html_text(SCRIPT) == "&lt;img src=x onerror=alert(1)&gt;"
    block = code_block("a ``` b\n<b>")
    assert block.startswith("````\n") and block.endswith("\n````")
    assert clean_metadata({SCRIPT: "y" * 5000})[SCRIPT].endswith("...")


def test_metadata_view_survives_what_a_stranger_writes():
    meta = {"ss_output_name": "\x1b[2J" + "n" * 1000, "ss_tag_frequency": "[" * 100_000,
            "ss_dataset_dirs": "{not json", "ss_training_started_at": "1e999"}
    facts = dict(training_facts(meta))
    assert "Title" in facts and training_tags(meta) == []
    assert shown(facts["Title"]).endswith("...") and "\x1b" not in shown(facts["Title"])
    assert shown("\ud800 lone") == "? lone"
    big = json.dumps({"f": {f"t{i}": i for i in range(100_000)}})
    assert training_tags({"ss_tag_frequency": big})[0] == ("t99999", 99999)


def test_the_kohya_import_report_shows_keys_and_values_as_text(tmp_path):
    from kohya_gui.fields import Form

    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({SCRIPT: "`" + SCRIPT + "`", "learning_rate": 1e-4,
                                "output_name": "ok"}))
    form = Form("lora")
    values, report = kohya_import.load_kohya_config(form, str(path))
    assert values is not None and "onerror" in report
    assert "<img" not in report and "`<" not in report
