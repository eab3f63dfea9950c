#!/usr/bin/env bash
# Makes the image of the `fdl cluster --slurm` test cluster, `fdl-test-debian:slurm`: the
# Debian image of debian-image.sh (this machine's release, minbase, no registry) with
# Debian's own Slurm (22.05 in bookworm: controller, node daemon, client tools), MUNGE for
# its authentication, procps (the daemons' process tracking reads /proc through it),
# rsync, and make, g++ and python3 (what `fdl cluster plan --backend native` checks for
# on the controller). An image that exists is kept; concurrent callers wait on debian-image.sh's lock.
# The munge key the package generated is baked in and shared by every container made from
# it: tests/slurm_fixture writes a fresh one per cluster before munged starts.
# Usage: slurm-image.sh. Exits 0 when the image exists.
set -euo pipefail
tag=fdl-test-debian:slurm
here=$(cd "$(dirname "$0")" && pwd)
"$here/debian-image.sh" "$tag" slurmctld slurmd slurm-client munge procps rsync make g++ python3
docker image inspect "$tag" >/dev/null 2>&1 ||
  { echo "$tag is still missing after debian-image.sh" >&2; exit 1; }
