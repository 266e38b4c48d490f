#!/usr/bin/env bash
# Installs everything nanscope needs from Debian bookworm's packages (root).
# Cheap to re-run: packages already installed are not fetched again.
set -euo pipefail
packages=(
  cmake ninja-build g++ ccache pkg-config
  libtorch-dev libopenblas0-pthread        # LibTorch 1.13 (CPU); OpenBLAS, not reference BLAS (10x on fp32)
  libhdf5-dev hdf5-tools                   # the run and snapshot files; h5dump for people
  libcli11-dev libgtest-dev libgmock-dev
  libgloo-dev                              # c10d ProcessGroupGloo headers (multi-process runs)
  python3-torch python3-h5py python3-numpy # TorchScript fixtures and the Python baseline
  debootstrap                              # the LibTorch 2.x lane's chroot
  libimgui-dev libglfw3-dev libstb-dev libgl-dev  # nanscope-view: Dear ImGui 1.86 (+GLFW/OpenGL3 backends)
  libgl1-mesa-dri xvfb xauth               # a software-GL X server for screenshots and tests without a display
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/nanscope-apt.log 2>&1 \
    || { tail -30 /tmp/nanscope-apt.log; exit 1; }
fi
