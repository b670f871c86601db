#!/usr/bin/env bash
# Configures and builds kolo into ./build (Release, Ninja, ccache if present).
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B build -G Ninja "${launcher[@]}" "$@"
ninja -C build -j"${KOLO_BUILD_JOBS:-2}"
