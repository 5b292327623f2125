#!/usr/bin/env bash
# Puts bubblewrap's bwrap beside the environment's python (forge.rollout.sandbox finds it there) when the host has none:
# the distribution's package, unpacked without installing it (no root needed). Usage: tools/install_bwrap.sh VENV_BIN
set -euo pipefail
bin=$1
if command -v bwrap >/dev/null || [[ -x $bin/bwrap ]]; then exit 0; fi
if ! command -v apt-get >/dev/null; then
    echo "warning: no bwrap and no apt-get: install bubblewrap for forge.rollout.sandbox" >&2
    exit 0
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
(cd "$scratch" && apt-get download -q bubblewrap >/dev/null 2>&1) || {
    echo "warning: could not download bubblewrap: install it for forge.rollout.sandbox" >&2; exit 0; }
dpkg-deb -x "$scratch"/bubblewrap_*.deb "$scratch/root"
install -m 0755 "$scratch/root/usr/bin/bwrap" "$bin/bwrap"
