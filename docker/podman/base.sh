#!/usr/bin/env bash
# The stand-in for python:3.11-slim where base images cannot be pulled: Debian bookworm (minbase)
# with its python3 (3.11) and venv, from Debian's packages, imported as an image. Kept when it
# exists: `podman rmi IMAGE` (or `make image-clean`) to build it anew.
#
#   docker/podman/base.sh [IMAGE]      default: localhost/headwise-base:bookworm
#
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

IMAGE=${1:-localhost/headwise-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if podman image exists "$IMAGE"; then
    echo "base: $IMAGE exists, kept"
    exit 0
fi

ROOTFS=$(mktemp -d /var/tmp/headwise-base.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
start=$SECONDS
debootstrap --variant=minbase --include=python3,python3-venv bookworm "$ROOTFS" "$MIRROR" \
    >"$ROOTFS.log" 2>&1 || { tail -n 30 "$ROOTFS.log" >&2; exit 1; }
rm -f "$ROOTFS.log"
# What python:3.11-slim leaves out too: package caches and lists, documentation, locales.
rm -rf "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
    "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* \
    "$ROOTFS"/usr/share/locale/* "$ROOTFS"/usr/share/info/*
tar -C "$ROOTFS" -c . | podman import --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null 2>&1
echo "base: built $IMAGE in $((SECONDS - start)) s ($(podman image inspect --format '{{.Size}}' "$IMAGE") bytes)"
