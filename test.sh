#!/usr/bin/env bash
# Run the whole test suite (CPU, tiny models, a real headless Chromium for the browser tests),
# one pytest worker per core, on the locked packages.
# Runs ./setup.sh --dev first (it does nothing when the venv already holds the current locks
# and the test tools; a venv that `./setup.sh --latest` or `--lowest` made keeps its versions),
# and installs Debian's chromium when it is missing and apt-get can be used. Extra arguments go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${KOHYA_VENV:-$PWD/.venv}
mode=()
case "$(cut -d' ' -f3 "$VENV/.kohya-setup-ok" 2>/dev/null)" in
  latest) mode=(--latest) ;;
  lowest) mode=(--lowest) ;;
esac
./setup.sh --dev "${mode[@]}"
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing Debian's chromium for the browser tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "test.sh: the browser tests need /usr/bin/chromium: sudo apt-get install chromium" >&2
    exit 1
  fi
fi
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
# One pytest worker per core (pytest-xdist), each test file on one worker so that a file's
# fixtures (a GUI server, a trained LoRA) are built once. Each test computes on one thread
# (tests/conftest.py), so the workers share the cores instead of fighting over them.
# KOHYA_TEST_WORKERS=0 runs everything in this process. A worker that dies (killed for its
# memory, a crash) ends the run with the test it was running named: pytest-xdist replaces a
# crashed worker and then, under --dist loadfile, can wait for ever (tests/test_test_sh.py).
exec "$VENV/bin/python" -m pytest -n "${KOHYA_TEST_WORKERS:-auto}" --dist loadfile \
  --max-worker-restart=0 "$@"
