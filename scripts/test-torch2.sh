#!/usr/bin/env bash
# The LibTorch 2.x lane: builds this tree against a Debian suite's
# libtorch-dev inside a debootstrap chroot (scripts/torch2-chroot.sh) and runs
# the whole test suite there, in build-torch2-SUITE.
# Usage: scripts/test-torch2.sh [CTEST_ARG...]   (root; the chroot is made on first use)
#        e.g. scripts/test-torch2.sh -L corpus
#        NANSCOPE_TORCH2_SUITE=trixie scripts/test-torch2.sh   (LibTorch 2.6; default forky, 2.14)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
suite=${NANSCOPE_TORCH2_SUITE:-forky}
root=${NANSCOPE_CHROOT:-/var/tmp/nanscope-$suite}
"$repo/scripts/torch2-chroot.sh" "$suite" "$root"

mkdir -p "$root/src"
cleanup() {
  for m in src dev/shm dev proc; do umountpoint "$root/$m"; done
}
umountpoint() { if mountpoint -q "$1"; then umount -l "$1"; fi; }
trap cleanup EXIT
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
mountpoint -q "$root/dev/shm" || mount -t tmpfs shm "$root/dev/shm"
mount --bind "$repo" "$root/src"

echo "torch2 lane: $suite, LibTorch $(chroot "$root" dpkg-query -W -f='${Version}' libtorch-dev)"
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root CCACHE_DIR=/root/.ccache \
  BUILD=build-torch2-$suite /bin/bash -c '
    set -euo pipefail
    cd /src
    # The benchmarks: the 1.13 lane builds them; here they would only cost minutes.
    # -O1 (the level the tests are compiled at in every lane): this lane checks
    # that the tree builds and behaves on LibTorch 2.x, the 1.13 lane builds
    # what users build (-O3). The tests spend their time in LibTorch and in
    # starting programs, not in our code: from clean, the lane built in 193 s
    # against 263 s at -O3, and its suite ran in about the same time.
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" \
      -DNANSCOPE_BUILD_BENCH=OFF >/tmp/torch2-configure.log || { cat /tmp/torch2-configure.log; exit 1; }
    ninja -C "$BUILD" -j2
    cd "$BUILD"
    # Debian testing links LibTorch to the pthread build of OpenBLAS, whose
    # threads spin beside those of ATen (OpenMP): with two tests at a time on
    # two cores, a replay took 4.1 s against 1.7 s with one BLAS thread, and
    # this lane 570 s against 468. The tests train small models; one BLAS
    # thread changes no result (OpenBLAS splits a product by rows and columns).
    export OPENBLAS_NUM_THREADS=1
    # Debian testing links LibTorch to Open MPI, which loads UCX, and UCX
    # installs its memory hooks as it loads by patching mmap and its kin,
    # spinning on sched_yield meanwhile: 0.4 s before main() in every test
    # program, nanscope-train and Python process (`nanscope-train --help`
    # 0.77 s against 0.37 s; 783,000 sched_yield calls against 2). Nothing
    # here uses MPI or UCX; the suite took 404 s with them off, 489 s on.
    export UCX_MEM_MMAP_HOOK_MODE=none
    ctest -j2 --output-on-failure --timeout 600 "$@"
  ' torch2-lane "$@"
