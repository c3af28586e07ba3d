#!/usr/bin/env bash
# Installs everything dpipe needs on Debian 12 (run as root, or with sudo available).
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
PACKAGES=(g++ meson ninja-build pkg-config python3 libboost-dev libcereal-dev libtbb-dev libgtest-dev libgmock-dev
          libbenchmark-dev libgoogle-perftools-dev nlohmann-json3-dev libcli11-dev libopenmpi-dev openmpi-bin gnuplot-nox
          python3-dev pybind11-dev python3-numpy python3-pytest python3-torch libsimdjson-dev libsentencepiece-dev sentencepiece
          python3-sentencepiece python3-mesonpy python3-venv python3-pip)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get -o DPkg::Lock::Timeout=300 update -q
  $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"
fi
