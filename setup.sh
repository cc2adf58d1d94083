#!/usr/bin/env bash
# Create the virtual environment (.venv in the checkout) and install the right PyTorch build.
#
#   ./setup.sh [--use-rocm | --use-ipex | --cuda | --cpu] [--dev] [--force] [--dry-run]
#
# Without a platform flag it probes, in this order: ROCm (rocminfo on the PATH or
# /opt/rocm/bin/rocminfo), an Intel GPU runtime (sycl-ls, xpu-smi or the Level Zero GPU driver),
# NVIDIA (nvidia-smi lists a GPU), else the CPU. --dev adds the test and lint tools.
# Safe to run twice: a venv whose install completed for the same platform and requirements is
# left alone (--force reinstalls). A failed install leaves no venv that looks valid.
# --dry-run only says which platform it would install for, and why.
set -euo pipefail

cd "$(dirname "$0")"
ROOT=$(pwd)
VENV=${KOHYA_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
MARKER=$VENV/.kohya-setup-ok
TORCH_VERSION=2.13.0

platform="" reason="" dev=0 force=0 dry=0
for arg in "$@"; do
  case "$arg" in
    --use-rocm) platform=rocm reason="--use-rocm was given" ;;
    --use-ipex) platform=ipex reason="--use-ipex was given" ;;
    --cuda) platform=cuda reason="--cuda was given" ;;
    --cpu) platform=cpu reason="--cpu was given" ;;
    --dev) dev=1 ;;
    --force) force=1 ;;
    --dry-run) dry=1 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done

intel_gpu_runtime() {
  command -v sycl-ls >/dev/null 2>&1 && return 0
  command -v xpu-smi >/dev/null 2>&1 && return 0
  ldconfig -p 2>/dev/null | grep -q 'libze_intel_gpu' && return 0
  return 1
}

if [ -z "$platform" ]; then
  if command -v rocminfo >/dev/null 2>&1; then
    platform=rocm reason="rocminfo is on the PATH"
  elif [ -x /opt/rocm/bin/rocminfo ]; then
    platform=rocm reason="/opt/rocm/bin/rocminfo exists"
  elif intel_gpu_runtime; then
    platform=ipex reason="an Intel GPU runtime was found"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    platform=cuda reason="nvidia-smi lists a GPU"
  else
    platform=cpu reason="no ROCm, Intel GPU runtime or NVIDIA GPU was found"
  fi
fi
echo "setup.sh: installing for $platform ($reason)"
[ "$dry" = 1 ] && exit 0

case "$platform" in
  rocm) torch_req=(-r requirements_linux_rocm.txt) ;;
  ipex) torch_req=(-r requirements_linux_ipex.txt) ;;
  *) torch_req=("torch==$TORCH_VERSION") ;;
esac
reqs=(requirements.txt)
[ "$dev" = 1 ] && reqs+=(requirements_dev.txt)
stamp="$platform dev=$dev $(cat "${reqs[@]}" requirements_linux_*.txt pyproject.toml | sha256sum | cut -c1-16)"

if [ "$force" = 0 ] && [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$stamp" ]; then
  echo "setup.sh: $VENV is already set up for $platform; nothing to do (--force reinstalls)"
  exit 0
fi

fresh=0
if [ ! -x "$VENV/bin/python" ]; then
  fresh=1
  "$PYTHON" -m venv "$VENV" || { echo "setup.sh: could not create $VENV with $PYTHON" >&2;
                                  rm -rf "$VENV"; exit 1; }
fi
rm -f "$MARKER"

fail() {
  echo "setup.sh: FAILED while $1." >&2
  echo "setup.sh: nothing was marked as installed; fix the cause and run ./setup.sh again." >&2
  [ "$fresh" = 1 ] && rm -rf "$VENV"
  exit 1
}

PIP=("$VENV/bin/python" -m pip)
if [ "$platform" = rocm ]; then
  # ROCm wheels are several GB: an old pip is slow and memory-hungry on them.
  "${PIP[@]}" install --upgrade pip || fail "upgrading pip"
fi
echo "setup.sh: installing PyTorch (${torch_req[*]})"
"${PIP[@]}" install "${torch_req[@]}" || fail "installing PyTorch for $platform"
echo "setup.sh: installing the dependencies (${reqs[*]})"
req_args=()
for r in "${reqs[@]}"; do req_args+=(-r "$r"); done
"${PIP[@]}" install "${req_args[@]}" || fail "installing ${reqs[*]}"
"${PIP[@]}" install --no-deps -e . || fail "installing the project itself"
"$VENV/bin/python" -c "import torch, diffusers, transformers, peft, accelerate, gradio" \
  || fail "checking that the installed packages import"
echo "$stamp" > "$MARKER"
echo "setup.sh: done. torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') in $VENV"
