#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages kolo needs, skipping what is present,
# then kolo's Python environment (scripts/install-python.sh: a pinned
# virtual environment outside the repository, torch 2.11.0;
# KOLO_SKIP_PYTHON_DEPS=1 skips it, as scripts/demo.sh does).
# Runs as root, or through sudo when it is available.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build ccache pkg-config git clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev libucx-dev ucx-utils libcli11-dev nlohmann-json3-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev
  openmpi-bin libopenmpi-dev libgloo-dev
  iproute2 iperf3 systemd linux-perf
  munge slurmctld slurmd slurm-client
  etcd-server etcd-client
  python3 python3-venv python3-pip
  openjdk-17-jre-headless
)
missing=()
for p in "${pkgs[@]}"; do
  [ -n "$p" ] || continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: every Debian package is installed"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
    SUDO=sudo
  fi
  echo "install-deps: installing ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ "${KOLO_SKIP_PYTHON_DEPS:-0}" = 1 ]; then
  echo "install-deps: Python environment skipped (KOLO_SKIP_PYTHON_DEPS=1)"
else
  "$(dirname "$0")/install-python.sh"
fi
