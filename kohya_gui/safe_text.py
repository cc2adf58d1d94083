"""Text from strangers, shown as text.

File metadata, caption files, file names, tensor names, imported configs and error messages that
quote them can hold markup (``<img src=x onerror=...>``, ``[a](javascript:...)``), megabytes of
text, control characters or bytes that are not UTF-8. Before any of it goes into a Markdown or
HTML component of the page it passes one of these functions: cut to a length with "...",
control characters replaced, and escaped so that Markdown and HTML read it as plain characters
(no element, no link, no image, no formula, no heading). Gradio's own sanitizer stays as the
second line of defence, not the first.
"""

from __future__ import annotations

import html
import re
from typing import Any

LIMIT = 300  # characters of one value in a report line
# What can make an element in Markdown: HTML (< > &), links and images ([ ]), emphasis, code and
# strike-through (* ` ~), the page's LaTeX ($), a backslash that would undo an escape; these
# become HTML character references, which CommonMark reads as plain characters, never as
# syntax. Autolinks (http://..., www...., mail@...) are broken the same way, and a block marker
# at the start (# - + = | 1.) is backslash-escaped. The rest (_ . : ' ") stays readable.
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;", "*": "&#42;",
             "`": "&#96;", "~": "&#126;", "$": "&#36;", "\\": "&#92;", "@": "&#64;"}
_AUTOLINKS = ((re.compile(r"://"), ":&#47;/"), (re.compile(r"(?i)\bwww\."), "www&#46;"))
_BLOCK_START = re.compile(r"^(\s*)([#+\-=|]|\d+[.)])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff]")


def cut(value: Any, limit: int = LIMIT) -> str:
    """``value`` as one line of printable text of at most ``limit`` characters ("..." marks a
    cut); control characters (terminal escapes too) become U+FFFD, line breaks spaces."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[: max(limit - 3, 0)] + "..."
    text = text.replace("\r\n", " ").replace("\n", " ").replace("\t", " ")
    text = text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates
    return _CONTROL.sub("\ufffd", text)


def md(value: Any, limit: int = LIMIT) -> str:
    """Text that a Markdown component shows character for character."""
    text = "".join(_ENTITIES.get(ch, ch) for ch in cut(value, limit))
    for pattern, replacement in _AUTOLINKS:
        text = pattern.sub(replacement, text)
    return _BLOCK_START.sub(lambda m: m.group(1) + "\\" + m.group(2), text, count=1)


def html_text(value: Any, limit: int = LIMIT) -> str:
    """Text for an HTML component (escaped, quotes included)."""
    return html.escape(cut(value, limit), quote=True)


def md_lines(items: list[Any], limit: int = LIMIT) -> str:
    """A Markdown list, one escaped item per line."""
    return "\n".join(f"- {md(item, limit)}" for item in items)


def code_block(text: str, limit: int = 20_000) -> str:
    """A fenced block that no line of ``text`` can close (the fence is longer than any run of
    backticks in it); inside it Markdown and HTML are not read."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    text = _CONTROL.sub("\ufffd", text.replace("\r\n", "\n").replace("\t", "    "))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def clean_metadata(meta: dict[Any, Any], limit: int = 2_000) -> dict[str, str]:
    """A file's metadata for a JSON view: keys and values as cut text."""
    return {cut(k, 200): cut(v, limit) for k, v in list(meta.items())[:500]}
