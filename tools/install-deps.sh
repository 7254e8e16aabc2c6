#!/usr/bin/env bash
# Install the Debian packages cohort needs that are missing (apt-get).
# Safe to run again: it installs nothing when everything is there.
set -euo pipefail
pkgs=(
  build-essential cmake pkg-config git         # toolchain
  libuv1-dev libmimalloc-dev libmsgpack-dev    # runtime dependencies
  libibverbs-dev librdmacm-dev                 # verbs engine (compiled when present)
  libcmocka-dev clang llvm                     # unit tests, clang build, libFuzzer
  python3 python3-numpy python3-pytest python3-msgpack python3-matplotlib python3-pip  # bindings, plots
  python3-venv python3-setuptools python3-wheel  # pip install of ffi/python into a venv (python.install)
  iproute2 nftables                            # namespace cluster tests
  libgloo-dev openmpi-bin libopenmpi-dev       # side-by-side benchmarks
)
# torch 1.13 and its C++ headers: the torch.distributed backend (ffi/torch) and
# its tests. ~700 MB with ~240 dependencies (about 2-4 minutes on a fresh
# machine); tools/test.sh asks for them (COHORT_DEPS_TORCH=1), the demo does not.
if [ "${COHORT_DEPS_TORCH:-0}" = 1 ]; then pkgs+=(python3-torch libtorch-dev pybind11-dev); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
