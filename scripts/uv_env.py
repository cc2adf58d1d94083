"""Print `export UV_...=...` lines that give uv the package sources of pip's configuration.

    eval "$(.venv/bin/python scripts/uv_env.py)"    # what setup.sh does before it uses uv

uv reads its own settings (UV_* variables, uv.toml), not pip's, so a machine whose pip is
configured with extra indexes, find-links or constraints (a company mirror, a wheelhouse, a
CI's cache) would install from elsewhere once setup.sh switches to uv. This maps what pip's
`pip config list` reports (files and PIP_* variables) onto uv's variables:

    index-url -> UV_DEFAULT_INDEX        extra-index-url -> UV_INDEX
    find-links -> UV_FIND_LINKS          constraint -> UV_CONSTRAINT
    no-index -> UV_NO_INDEX              trusted-host -> UV_INSECURE_HOST
    cert -> SSL_CERT_FILE

and, when extra indexes are mapped, UV_INDEX_STRATEGY=unsafe-best-match: pip merges all of its
sources and takes the best version, while uv by default stops at the first index that has the
package. A variable that is already set is left alone (yours win), and nothing is printed on a
machine whose pip has no such configuration.
"""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys

# pip's key -> (uv's variable, the separator uv expects between several values)
MAPPING = {
    "index-url": ("UV_DEFAULT_INDEX", None),
    "extra-index-url": ("UV_INDEX", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "no-index": ("UV_NO_INDEX", None),
    "trusted-host": ("UV_INSECURE_HOST", " "),
    "cert": ("SSL_CERT_FILE", None),
}
# later scopes win, as in pip: the global, user and site files, then PIP_* variables
SECTIONS = ("global", "install", ":env:")


def pip_settings(listing: str) -> dict[str, str]:
    """{key: value} from `pip config list` (lines like global.find-links='/opt/wheels'); the
    `install` section wins over `global`, and PIP_* variables (":env:") over both."""
    found: dict[tuple[int, str], str] = {}
    for line in listing.splitlines():
        name, sep, raw = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in SECTIONS:
            continue
        try:
            value = ast.literal_eval(raw)  # pip prints the value's repr()
        except (ValueError, SyntaxError):
            continue
        if not isinstance(value, str):
            continue
        found[(SECTIONS.index(section), key)] = value
    settings: dict[str, str] = {}
    for (_, key), value in sorted(found.items(), key=lambda item: item[0][0]):
        settings[key] = value
    return settings


def uv_variables(settings: dict[str, str], environ: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, (variable, sep) in MAPPING.items():
        value = settings.get(key, "").strip()
        if not value or variable in environ:
            continue
        if key == "no-index":
            if value.lower() in ("1", "true", "yes", "on"):
                out[variable] = "1"
            continue
        out[variable] = sep.join(value.split()) if sep else value
    if "UV_INDEX" in out and "UV_INDEX_STRATEGY" not in environ:
        out["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    return out


def main() -> int:
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                          text=True)
    listing = proc.stdout if proc.returncode == 0 else ""
    for variable, value in uv_variables(pip_settings(listing), dict(os.environ)).items():
        print(f"export {variable}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
