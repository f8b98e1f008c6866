#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (run as root, or with sudo
# available): installs the system packages, configures, builds, then
#   demo  -> runs `backplane demo` (the main job) on every device found
#   test  -> runs the whole test suite through ctest
#   build -> only builds
# Environment: BUILD_DIR (default build), SANITIZE=1 (ASan+UBSan build),
# JOBS (default: all cores), SKIP_APT=1 (packages already there).
set -euo pipefail
cd "$(dirname "$0")/.."

what="${1:-test}"
BUILD_DIR="${BUILD_DIR:-build}"
JOBS="${JOBS:-$(nproc)}"

packages=(build-essential cmake pkg-config libboost-dev nlohmann-json3-dev catch2
          libvulkan-dev mesa-vulkan-drivers glslang-tools glslang-dev vulkan-validationlayers
          python3-numpy libgrpc++-dev libprotobuf-dev protobuf-compiler-grpc libdnnl-dev libdlpack-dev
          pybind11-dev python3-dev python3-pytest python3-torch clang libfuzzer-14-dev openssl
          libonnx-dev python3-torchvision)
if [ "${SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
[ "${SANITIZE:-0}" = 1 ] && cmake_args+=(-DBACKPLANE_SANITIZE=ON)
cmake -S . -B "$BUILD_DIR" "${cmake_args[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"

case "$what" in
  build) ;;
  demo) "$BUILD_DIR/bin/backplane" demo ;;
  test) ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" ;;
  *) echo "usage: scripts/dev.sh demo|test|build" >&2; exit 2 ;;
esac
