#!/usr/bin/env bash
# Create the virtual environment (.venv in the checkout) with the locked packages for this
# machine's PyTorch build.
#
#   ./setup.sh [--use-rocm | --use-ipex | --cuda | --cpu] [--dev] [--latest | --lowest] [--force]
#              [--compile-later] [--dry-run]
#
# Without a platform flag it probes, in this order: ROCm (rocminfo on the PATH or
# /opt/rocm/bin/rocminfo), an Intel GPU runtime (sycl-ls, xpu-smi or the Level Zero GPU driver),
# NVIDIA (nvidia-smi lists a GPU), else the CPU. It installs torch for that platform
# (requirements_linux_<platform>.txt), then locks/<platform>.txt: exact versions with hashes,
# the set the tests passed with. --dev adds the test and lint tools (locks/dev.txt).
# --latest installs the newest versions that requirements*.txt's ranges allow instead (for
# whoever upgrades; README, "Upgrading dependencies"); --lowest the lowest versions they allow
# for each requirement (uv's lowest-direct; scripts/lowest.sh checks the lower bounds with it).
# Safe to run twice: a venv whose install completed for the same platform, mode and files is
# left alone (--force reinstalls). A failed install leaves no venv that looks valid.
# The packages' bytecode is compiled as they install; with --compile-later (what ./gui.sh's
# first run uses) in the background at the lowest priority once they are installed, while the
# app starts: what the first page imports is compiled by that import.
# --dry-run only says which platform it would install for, and why.
# The installer is uv, which setup.sh puts into the venv with pip (locks/bootstrap.txt); it
# gets the package sources of your pip configuration (scripts/uv_env.py).
set -euo pipefail

cd "$(dirname "$0")"
ROOT=$(pwd)
VENV=${KOHYA_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
MARKER=$VENV/.kohya-setup-ok

platform="" reason="" dev=0 mode=lock force=0 dry=0 later=0
for arg in "$@"; do
  case "$arg" in
    --use-rocm) platform=rocm reason="--use-rocm was given" ;;
    --use-ipex) platform=ipex reason="--use-ipex was given" ;;
    --cuda) platform=cuda reason="--cuda was given" ;;
    --cpu) platform=cpu reason="--cpu was given" ;;
    --dev) dev=1 ;;
    --latest) mode=latest ;;
    --lowest) mode=lowest ;;
    --force) force=1 ;;
    --dry-run) dry=1 ;;
    --compile-later) later=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
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
announce() {
  local how=""
  [ "$mode" = latest ] && how=", newest versions (--latest)"
  [ "$mode" = lowest ] && how=", lowest versions (--lowest)"
  echo "setup.sh: installing for $platform ($reason)$how"
}
[ "$dry" = 1 ] && { announce; exit 0; }

torch_file=requirements_linux_$platform.txt
torch_version=$(sed -n 's/^torch==\([^ ;#]*\).*/\1/p' "$torch_file" | head -n 1)
if [ "$mode" = lock ]; then
  reqs=("locks/$platform.txt")
  [ "$dev" = 1 ] && reqs+=(locks/dev.txt)
else
  reqs=(requirements.txt)
  [ "$dev" = 1 ] && reqs+=(requirements_dev.txt)
fi
stamp="$platform dev=$dev $mode $(cat "${reqs[@]}" "$torch_file" locks/bootstrap.txt pyproject.toml \
  | sha256sum | cut -c1-16)"

if [ "$force" = 0 ] && [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$stamp" ]; then
  echo "setup.sh: $VENV is already set up for $platform ($mode); nothing to do (--force reinstalls)"
  exit 0
fi
announce

fresh=0
if [ ! -x "$VENV/bin/python" ]; then
  fresh=1
  # no pip from ensurepip here (seconds): the bootstrap below installs the locked pip with uv
  "$PYTHON" -m venv "$VENV" --without-pip || { echo "setup.sh: could not create $VENV with $PYTHON" >&2;
                                                rm -rf "$VENV"; exit 1; }
fi
rm -f "$MARKER"

fail() {
  echo "setup.sh: FAILED while $1." >&2
  echo "setup.sh: nothing was marked as installed; fix the cause and run ./setup.sh again." >&2
  [ "$fresh" = 1 ] && rm -rf "$VENV"
  exit 1
}

# uv and pip into the venv, at their locked versions: with the pip of $PYTHON when it can install
# into another interpreter (pip >= 22.3), else with the venv's own pip from ensurepip.
uv_version=$(sed -n 's/^uv==\([^ ;]*\).*/\1/p' locks/bootstrap.txt)
UV=$VENV/bin/uv
if [ "$("$UV" --version 2>/dev/null)" != "uv $uv_version" ]; then
  echo "setup.sh: installing uv $uv_version into the venv (locks/bootstrap.txt)"
  "$PYTHON" -m pip --python "$VENV/bin/python" install -q --require-hashes \
      -r locks/bootstrap.txt >/dev/null 2>&1 \
    || { "$VENV/bin/python" -m ensurepip -q >/dev/null 2>&1 \
         && "$VENV/bin/python" -m pip install -q --require-hashes -r locks/bootstrap.txt; } \
    || fail "installing uv (locks/bootstrap.txt; it needs pip for $PYTHON, or ensurepip:
  on Debian and Ubuntu, apt install python3-venv)"
fi
uv_env=$("$VENV/bin/python" scripts/uv_env.py) || fail "reading pip's configuration for uv"
eval "$uv_env"
# --compile-bytecode: the .pyc files are written as the packages install (about 25 s on 2
# cores), rather than by each module's first import, or by none where Python may not write
# them (PYTHONDONTWRITEBYTECODE, a read-only venv): without them every process spends about
# 6 s more importing torch, transformers and diffusers (12.8 s instead of 6.3 s here). With
# --compile-later they are written in the background once the install is done (below).
UV_PIP=("$UV" pip install --python "$VENV/bin/python")
[ "$later" = 1 ] || UV_PIP+=(--compile-bytecode)

echo "setup.sh: installing PyTorch $torch_version for $platform"
case "$platform/$mode" in
  cuda/lock) ;;  # locks/cuda.txt holds PyPI's torch and the CUDA libraries it pins, hashed
  cpu/*)
    # a CPU build that your own package sources hold (pip's or uv's find-links and indexes: a
    # wheelhouse, a mirror) first; else PyTorch's CPU index. Never PyPI's Linux torch: its
    # CUDA libraries are 3 GB that the CPU does not use.
    "${UV_PIP[@]}" -q "torch==$torch_version+cpu" >/dev/null 2>&1 \
      || "${UV_PIP[@]}" -r "$torch_file" || fail "installing PyTorch for cpu ($torch_file)" ;;
  *) "${UV_PIP[@]}" -r "$torch_file" || fail "installing PyTorch for $platform ($torch_file)" ;;
esac

# torch stays the build just installed: its exact version, local label included (2.13.0+cpu),
# constrains the rest; with "torch==2.13.0" an --upgrade would swap in PyPI's CUDA build.
installed=$torch_version  # cuda/lock: torch comes with the lock
if [ "$platform/$mode" != cuda/lock ]; then
  installed=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))') \
    || fail "reading the version of the torch just installed"
fi
pin_dir=$(mktemp -d)
trap 'rm -rf "$pin_dir"' EXIT
echo "torch==$installed" > "$pin_dir/torch.txt"
constraints=(-c "$pin_dir/torch.txt")
for c in ${UV_CONSTRAINT:-}; do constraints+=(-c "$c"); done
req_args=()
for r in "${reqs[@]}"; do req_args+=(-r "$r"); done
echo "setup.sh: installing ${reqs[*]}"
case "$mode" in
  lock) how=() ;;
  latest) how=(--upgrade) ;;
  lowest) how=(--upgrade --resolution lowest-direct) ;;
esac
"${UV_PIP[@]}" "${how[@]}" "${constraints[@]}" "${req_args[@]}" || fail "installing ${reqs[*]}"
# the project itself, editable; setuptools is in the venv (torch needs it), so no build venv
"${UV_PIP[@]}" -q --no-deps --no-build-isolation -e . \
  || "${UV_PIP[@]}" -q --no-deps -e . || fail "installing the project itself"
# The check: every installed package's requirements are met (uv pip check), and torch, the one
# build that depends on the machine, loads. (Importing diffusers, transformers, peft and gradio
# as well took 15 s on 2 cores, which the app's own start pays again right after.)
"$UV" pip check --python "$VENV/bin/python" -q || fail "checking the installed packages' requirements"
"$VENV/bin/python" -c "import torch" || fail "checking that torch loads"
if [ "$later" = 1 ]; then
  # at the lowest priority while the app starts, whose own imports compile what the first
  # page needs; a file that does not compile (a template, another Python's syntax) is left as
  # it is, as uv's --compile-bytecode leaves it
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
    || fail "finding the venv's site-packages"
  echo "setup.sh: compiling the packages' bytecode in the background (lowest priority)"
  nohup nice -n 19 "$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 &
fi
echo "$stamp" > "$MARKER"
echo "setup.sh: done. torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') in $VENV"
