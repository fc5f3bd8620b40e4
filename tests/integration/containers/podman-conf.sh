#!/bin/sh
# /etc/containers/containers.conf for the container tests (idempotent; run as root): written when it is absent or
# differs from containers.conf here (explicit default ulimits, runtime runc: see README.md here); a different file that
# this script did not write is kept as containers.conf.tritonops-backup. Run by setup.sh, and by engines.Podman.start()
# before the first podman command of a test session (the tests that use podman need it, whichever runs first).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
conf=/etc/containers/containers.conf
marker='Written by tests/integration/containers/setup.sh'

log() { echo "podman-conf.sh: $*" >&2; }

if ! cmp -s "$here/containers.conf" "$conf"; then
    mkdir -p /etc/containers
    if [ -f "$conf" ] && ! grep -q "$marker" "$conf"; then
        log "keeping the previous $conf as $conf.tritonops-backup"
        cp -p "$conf" "$conf.tritonops-backup"
    fi
    log "writing $conf"
    cp "$here/containers.conf" "$conf.tmp.$$"
    chmod 0644 "$conf.tmp.$$"
    mv "$conf.tmp.$$" "$conf"
fi

