#!/usr/bin/env bash
# Builds (once) a Debian trixie chroot with libtorch-dev 2.6 and the other build
# dependencies, so the LibTorch 2.x lane can build and test the same tree.
# Usage: scripts/torch2-chroot.sh [CHROOT_DIR]   (default /var/tmp/nanscope-trixie)
# Re-running is cheap: a chroot that already has libtorch-dev is left as it is.
set -euo pipefail
root=${1:-${NANSCOPE_CHROOT:-/var/tmp/nanscope-trixie}}
mirror=${NANSCOPE_MIRROR:-http://deb.debian.org/debian}
# The packages scripts/debian-packages.txt marks "both", sorted (the marker compares lists).
packages=$(sed 's/#.*//' "$(dirname "$0")/debian-packages.txt" | awk '$2 == "both" {print $1}' | sort -u | xargs)

if ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
# The marker holds the package list it was made with: a list that grew since
# (a new dependency) installs the missing packages into the existing chroot.
if [ -f "$root/.nanscope-ready" ] && [ "$(xargs -n1 <"$root/.nanscope-ready" | sort -u | xargs)" = "$packages" ]; then
  echo "torch2-chroot: $root is ready"
  exit 0
fi
if [ ! -x "$root/usr/bin/apt-get" ]; then
  echo "torch2-chroot: debootstrap trixie into $root"
  rm -rf "$root"
  debootstrap --variant=minbase trixie "$root" "$mirror" >/tmp/nanscope-debootstrap.log 2>&1 \
    || { tail -20 /tmp/nanscope-debootstrap.log; exit 1; }
fi
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
trap 'umount "$root/proc" 2>/dev/null || true' EXIT
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
echo "torch2-chroot: installing libtorch-dev 2.x and build dependencies"
# dpkg --configure -a: finishes an install that an earlier run was stopped in.
chroot "$root" /bin/sh -c "export DEBIAN_FRONTEND=noninteractive; dpkg --configure -a && apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages" \
  >/tmp/nanscope-chroot-apt.log 2>&1 || { tail -20 /tmp/nanscope-chroot-apt.log; exit 1; }
printf %s "$packages" >"$root/.nanscope-ready"
echo "torch2-chroot: ready ($(chroot "$root" dpkg-query -W -f='${Version}' libtorch-dev))"
