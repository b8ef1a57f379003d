#!/usr/bin/env bash
# Installs the given Debian packages that are not installed yet (none: no
# apt-get run at all, so a set-up with nothing to do stays fast and offline).
# Usage: scripts/apt-install.sh LABEL PACKAGE...
set -euo pipefail
label=$1
shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0
echo "$label: installing Debian packages: ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
