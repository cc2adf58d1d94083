#!/usr/bin/env bash
# Are requirements.txt's lower bounds honest? Installs the lowest versions that its ranges
# allow into a venv of its own (./setup.sh --lowest: uv's lowest-direct resolution, each
# requirement at the lowest version that resolves, what they need at the newest that fits) and
# runs a smoke subset of the tests on them: training in each mode, the optimizers, LyCORIS, the
# exports loaded back in diffusers, the tools, the app's API.
#
#   scripts/lowest.sh [pytest arguments]      (the venv: $KOHYA_LOWEST_VENV, else .venv-lowest)
#
# torch stays the platform's build of requirements_linux_<platform>.txt: its lower bound in
# requirements.txt is not tried here (PyTorch's old builds are GBs per platform).
# CI can run it as is; it needs the package index, and prints the versions it tested.
set -euo pipefail
cd "$(dirname "$0")/.."
export KOHYA_VENV=${KOHYA_LOWEST_VENV:-$PWD/.venv-lowest}
./setup.sh --lowest --dev
SMOKE=(tests/test_config.py tests/test_models_tiny.py tests/test_loop.py tests/test_dreambooth.py
       tests/test_textual_inversion.py tests/test_export_lora.py tests/test_optim.py
       tests/test_lycoris.py tests/test_tools_caption.py tests/test_cli.py tests/test_gui_api.py)
echo "scripts/lowest.sh: the lowest versions that requirements.txt allows, as installed:"
"$KOHYA_VENV/bin/uv" pip freeze -q --python "$KOHYA_VENV/bin/python" --exclude-editable \
  | grep -i -E "^($(sed -n 's/^\([A-Za-z0-9._-]*\).*/\1/p' requirements.txt | paste -sd'|'))==" \
  | paste -sd' '
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
exec "$KOHYA_VENV/bin/python" -m pytest -n "${KOHYA_TEST_WORKERS:-0}" -p no:cacheprovider \
  "${SMOKE[@]}" "$@"
