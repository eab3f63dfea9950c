#!/usr/bin/env bash
# Makes a local CUDA build image with no registry: the Debian image of debian-image.sh
# with g++, make, python3 and git, plus the CUDA toolchain of the PyPI wheels unpacked
# at HOME (`.../nvidia/cu13`, as .ci/fetch-oracles lays it out), kept in the wheels'
# own layout (lib/, not lib64/) at /opt/nvidia/cu13 with nvcc on PATH.
# Usage: cuda-image.sh TAG HOME. A TAG that exists is kept. Nothing in it uses the network.
set -euo pipefail
tag=$1 home=$2
here=$(cd "$(dirname "$0")" && pwd)
base=fdl-test-debian:toolchain
"$here/debian-image.sh" "$base" g++ make python3 git
exec 9>"${TMPDIR:-/tmp}/fdl-test-cuda-image.lock"
flock 9
docker image inspect "$tag" >/dev/null 2>&1 && exit 0
[ -x "$home/bin/nvcc" ] || { echo "no nvcc at $home/bin: run 'source .ci/fetch-oracles'" >&2; exit 1; }
# The context is the unpacked wheels' root (holding nvidia/cu13), so nothing is copied here.
context=$(cd "$home/../.." && pwd)
rel=${home#"$context"/}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
printf 'FROM %s\nCOPY %s /opt/nvidia/cu13\nENV PATH=/opt/nvidia/cu13/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n' \
  "$base" "$rel" |
  DOCKER_BUILDKIT=0 docker build -q --network none -t "$tag" -f - "$context" >"$log" 2>&1 ||
  { cat "$log" >&2; exit 1; }
echo "made $tag" >&2
