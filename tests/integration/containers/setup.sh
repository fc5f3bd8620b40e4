#!/bin/sh
# Test-machine setup for the container tests (idempotent; run as root):
#   1. install podman and runc from the distribution if podman is missing (Debian/Ubuntu: apt-get);
#   2. podman-conf.sh: write /etc/containers/containers.conf when it is absent or differs from ours
#      (explicit default ulimits, runtime runc: see README.md here); a different
#      file that we did not write is kept as containers.conf.tritonops-backup;
#   3. build (or reuse) the local tritonserver image from the nvidia-pytriton wheel.
# Usage: setup.sh VENV_PYTHON   -- prints the image reference on the last line.
# Exit codes: 0 ready, 3 podman is not available and cannot be installed here, other: failure.
set -eu
py=${1:?usage: setup.sh VENV_PYTHON}
here=$(cd "$(dirname "$0")" && pwd)

log() { echo "setup.sh: $*" >&2; }

if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        log "podman/runc missing and cannot be installed here (needs root and apt-get)"
        exit 3
    fi
    log "installing podman and runc"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q podman runc >&2 || { apt-get update -q >&2 && apt-get install -y -q podman runc >&2; }
fi

"$here/podman-conf.sh"

exec "$py" "$here/build_image.py"
