#!/usr/bin/env bash
# Builds (once) a Debian chroot with LibTorch 2.x and the other build
# dependencies, so the LibTorch 2.x lane can build and test the same tree:
#   trixie  LibTorch 2.6, Python 3.13
#   forky   Debian testing: LibTorch 2.14, Python 3.14, Accelerate, Ignite
# Usage: scripts/torch2-chroot.sh [SUITE [CHROOT_DIR]]
#        (SUITE defaults to $NANSCOPE_TORCH2_SUITE, else forky; CHROOT_DIR to
#        $NANSCOPE_CHROOT, else /var/tmp/nanscope-SUITE)
# Re-running is cheap: a chroot that already has its packages is left as it is.
set -euo pipefail
suite=${1:-${NANSCOPE_TORCH2_SUITE:-forky}}
root=${2:-${NANSCOPE_CHROOT:-/var/tmp/nanscope-$suite}}
mirror=${NANSCOPE_MIRROR:-http://deb.debian.org/debian}
case "$suite" in
  trixie) script= apt_options= ;;
  # bookworm's debootstrap has no script for forky: testing is made like sid.
  # The testing suite's Release file may carry an expired Valid-Until date.
  forky) script=/usr/share/debootstrap/scripts/sid apt_options="-o Acquire::Check-Valid-Until=false" ;;
  *) echo "torch2-chroot: unknown suite '$suite' (trixie or forky)" >&2; exit 2 ;;
esac
# The packages scripts/debian-packages.txt marks "both" or with this suite, sorted (the marker compares lists).
packages=$(sed 's/#.*//' "$(dirname "$0")/debian-packages.txt" |
  awk -v suite="$suite" '$2 == "both" || $2 == suite {print $1}' | sort -u | xargs)

if ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
# The marker holds the package list it was made with: a list that grew since
# (a new dependency) installs the missing packages into the existing chroot.
if [ -f "$root/.nanscope-ready" ] && [ "$(xargs -n1 <"$root/.nanscope-ready" | sort -u | xargs)" = "$packages" ]; then
  echo "torch2-chroot: $root ($suite) is ready"
  exit 0
fi
if [ ! -x "$root/usr/bin/apt-get" ]; then
  echo "torch2-chroot: debootstrap $suite into $root"
  rm -rf "$root"
  # shellcheck disable=SC2086  # no script: debootstrap's own for the suite
  debootstrap --variant=minbase "$suite" "$root" "$mirror" $script >/tmp/nanscope-debootstrap-$suite.log 2>&1 \
    || { tail -20 /tmp/nanscope-debootstrap-$suite.log; exit 1; }
fi
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
trap 'umount "$root/proc" 2>/dev/null || true' EXIT
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
echo "torch2-chroot: installing libtorch-dev 2.x and build dependencies ($suite)"
# dpkg --configure -a: finishes an install that an earlier run was stopped in.
chroot "$root" /bin/sh -c "export DEBIAN_FRONTEND=noninteractive; dpkg --configure -a && apt-get $apt_options update -qq && apt-get $apt_options install -y -qq --no-install-recommends $packages" \
  >/tmp/nanscope-chroot-apt-$suite.log 2>&1 || { tail -20 /tmp/nanscope-chroot-apt-$suite.log; exit 1; }
printf %s "$packages" >"$root/.nanscope-ready"
echo "torch2-chroot: ready ($suite, libtorch-dev $(chroot "$root" dpkg-query -W -f='${Version}' libtorch-dev))"
