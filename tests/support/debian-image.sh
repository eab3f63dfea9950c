#!/usr/bin/env bash
# Makes a local Debian image for the tests, since no registry can be pulled from:
# `debootstrap --variant=minbase` of the Debian release this machine runs, from the
# mirror its apt sources name, with the packages given, then `docker import`.
# Usage: debian-image.sh TAG [PACKAGE...]. A TAG that exists is kept: the image is the
# cache. Concurrent callers wait on one lock, so the image is built once.
set -euo pipefail
tag=$1; shift
packages=$(IFS=,; echo "$*")

lock_dir=${TMPDIR:-/tmp}
exec 9>"$lock_dir/fdl-test-debian-image.lock"
flock 9
if docker image inspect "$tag" >/dev/null 2>&1; then
  exit 0
fi

command -v debootstrap >/dev/null ||
  { echo "debootstrap is missing: install it (apt-get install debootstrap)" >&2; exit 1; }
# shellcheck disable=SC1091
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}")
# The first Debian mirror the machine's apt sources name (deb822 or one-line format).
mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
  awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }')
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }')
fi
[ -n "$mirror" ] || { echo "no Debian mirror found in /etc/apt/sources.list*" >&2; exit 1; }

root=$(mktemp -d "$lock_dir/fdl-test-rootfs.XXXXXX")
trap 'rm -rf "$root"' EXIT
# mktemp made it 0700: as the image's `/` it would shut out every user but root (munge's
# postinst runs as its own user and could not reach /bin/sh).
chmod 755 "$root"
echo "debootstrap $suite from $mirror with: ${packages:-(minbase only)}" >&2
debootstrap --variant=minbase ${packages:+--include="$packages"} "$suite" "$root" "$mirror" >"$root.log" 2>&1 ||
  { tail -n 30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# Nothing the image holds should reach back for the network: drop apt's lists.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | docker import - "$tag" >/dev/null
echo "imported $tag" >&2
