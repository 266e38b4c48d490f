#!/usr/bin/env bash
# Installs everything nanscope needs from Debian bookworm's packages (root).
# Cheap to re-run: packages already installed are not fetched again.
set -euo pipefail
# The packages of scripts/debian-packages.txt for this machine (every lane's and the host's; not one chroot's alone).
mapfile -t packages < <(sed 's/#.*//' "$(dirname "$0")/debian-packages.txt" | awk '$2 == "both" || $2 == "host" {print $1}')
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
