#!/usr/bin/env bash
# Installs the Debian packages mhcc builds from. Idempotent: installs only what is
# missing, and runs `apt-get update` only when something is.
set -euo pipefail
PACKAGES=(
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  nlohmann-json3-dev libgtest-dev
  bazel-bootstrap bazel-rules-java bazel-platforms bazel-skylib
  libopenmpi-dev openmpi-bin
  libcli11-dev libxxhash-dev
  libsentencepiece-dev sentencepiece
  clang-22 libfuzzer-22-dev libclang-rt-22-dev
  python3 python3-numpy python3-matplotlib
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
