#!/usr/bin/env bash
# Creates (or brings up to date) kolo's one Python environment: a virtual
# environment outside the repository, from the machine's python3, with the
# pins of scripts/python-requirements.txt. Every test, example and benchmark
# runs its interpreter ($KOLO_PYTHON, scripts/python-env.sh).
#
# Fast when everything is there (one pip check, no download). Checks free
# disk before a download and says how much it needs; a stalled or failed
# download is retried once. torch's Linux wheel on PyPI is the CUDA build:
# a cold install downloads about 3 GB (docs/operations.md, "Python").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=python-env.sh
. "$here/python-env.sh"
req=$here/python-requirements.txt
need_mb=${KOLO_PYTHON_NEED_MB:-9000}
stamp=$KOLO_VENV/.kolo-requirements

if [ -x "$KOLO_PYTHON" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp" &&
   "$KOLO_PYTHON" -c 'import torch, pytest, numpy, yaml' 2>/dev/null; then
  echo "install-python: $KOLO_VENV is up to date ($("$KOLO_PYTHON" -c 'import torch; print("torch", torch.__version__)'))"
  exit 0
fi

base=${KOLO_BASE_PYTHON:-$(command -v python3 || true)}
[ -n "$base" ] || { echo "install-python: no python3 on PATH (install-deps.sh installs it)" >&2; exit 1; }
mkdir -p "$(dirname "$KOLO_VENV")"
avail_mb=$(df -Pm "$(dirname "$KOLO_VENV")" | awk 'NR==2 {print $4}')
if [ "$avail_mb" -lt "$need_mb" ]; then
  echo "install-python: $(dirname "$KOLO_VENV") has ${avail_mb} MB free; kolo's Python environment needs about ${need_mb} MB (torch's CUDA wheel and its NVIDIA libraries). Free space or set KOLO_VENV elsewhere." >&2
  exit 1
fi
if [ ! -x "$KOLO_PYTHON" ]; then
  echo "install-python: creating $KOLO_VENV from $base ($("$base" --version 2>&1))"
  "$base" -m venv "$KOLO_VENV"
fi
start=$SECONDS
pip_install() {
  "$KOLO_PYTHON" -m pip install --disable-pip-version-check -q --timeout 60 "$@"
}
pip_install --upgrade pip >/dev/null 2>&1 || true
if ! pip_install -r "$req"; then
  echo "install-python: the install failed or stalled; retrying once" >&2
  pip_install -r "$req"
fi
TF_CPP_MIN_LOG_LEVEL=3 "$KOLO_PYTHON" -c 'import torch, pytest, numpy, yaml, torchvision, lightning_fabric, pytorch_lightning, accelerate, tensorflow, keras, tf_keras'
cp "$req" "$stamp"
echo "install-python: $KOLO_VENV ready in $((SECONDS - start)) s ($("$KOLO_PYTHON" -c 'import torch; print("torch", torch.__version__)'))"
