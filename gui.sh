#!/usr/bin/env bash
# Start the web UI (http://127.0.0.1:7860 by default). Runs ./setup.sh first when the venv is
# missing or incomplete (the packages' bytecode then compiles in the background while the app
# starts). Extra arguments go to the app: --listen, --port, --inbrowser,
# --username/--password (see ./gui.sh --help).
set -euo pipefail
cd "$(dirname "$0")"
VENV=${KOHYA_VENV:-$PWD/.venv}
if [ ! -f "$VENV/.kohya-setup-ok" ]; then
  ./setup.sh --compile-later
fi
exec "$VENV/bin/python" -m kohya_gui "$@"
