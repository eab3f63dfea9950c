#!/usr/bin/env bash
# Makes the image of the `fdl cluster` test hosts, `fdl-test-debian:sshd`: the Debian image
# of debian-image.sh (this machine's release, minbase, no registry) with OpenSSH's server
# and rsync. An image that exists is kept; concurrent callers wait on debian-image.sh's lock.
# The host keys debootstrap generated are baked in and shared by every container made from
# it: tests/cluster_fixture makes each container generate its own before sshd starts.
# Usage: sshd-image.sh. Exits 0 when the image exists.
set -euo pipefail
tag=fdl-test-debian:sshd
here=$(cd "$(dirname "$0")" && pwd)
"$here/debian-image.sh" "$tag" openssh-server rsync
docker image inspect "$tag" >/dev/null 2>&1 ||
  { echo "$tag is still missing after debian-image.sh" >&2; exit 1; }
