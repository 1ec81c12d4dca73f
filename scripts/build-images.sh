#!/usr/bin/env bash
# Builds the lab's images without a registry or a Docker engine, and writes them as OCI
# archives that `ctr -n k8s.io images import` loads into each lab node's containerd:
#
#   hoststack.oci        hoststack.lab/hoststack:dev  (operator and agent, static musl binaries)
#   pause.oci            hoststack.lab/pause:dev      (the nodes' sandbox image)
#
#   scripts/build-images.sh [OUT_DIR]      # default $HOSTSTACK_CACHE/images; prints OUT_DIR
#   HOSTSTACK_IMAGE_BINARIES=target/debug scripts/build-images.sh OUT_DIR
#
# With HOSTSTACK_IMAGE_BINARIES the image takes hoststack-operator and hoststack-agent from that
# directory instead (the lab passes the binaries its tests already built, so a test run never
# waits for a second, release build), stripped, with the shared libraries they link (from ldd)
# copied in at their paths.
#
# The Dockerfile's `lab` and `lab-pause` targets copy what this script builds on the host:
# hoststack-operator and hoststack-agent (with its test hooks, the `test-hooks` feature, which
# the lab's tests use and the users' image lacks) for x86_64-unknown-linux-musl (static; their own
# target dir under the cache, so they never wait on the workspace's cargo lock) and
# e2e/pause/pause.c compiled with `gcc -static`. buildah uses the vfs driver and a storage root
# under the cache, and its copies are removed once exported.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${HOSTSTACK_CACHE:-/var/cache/hoststack}
OUT=${1:-$CACHE/images}
TARGET=x86_64-unknown-linux-musl
MUSL_TARGET_DIR=${HOSTSTACK_MUSL_TARGET_DIR:-$CACHE/target-musl}
IMAGE=${HOSTSTACK_LAB_IMAGE:-hoststack.lab/hoststack:dev}
PAUSE_IMAGE=${HOSTSTACK_LAB_PAUSE_IMAGE:-hoststack.lab/pause:dev}

log() { echo "[images] $*" >&2; }

if [ -z "${HOSTSTACK_IMAGE_BINARIES:-}" ]; then
  rustup target list --installed 2>/dev/null | grep -qx "$TARGET" || rustup target add "$TARGET" >&2
  log "building hoststack-operator and hoststack-agent for $TARGET (release)"
  # Run from a test, cargo's package variables of the test leak in; build scripts that watch
  # them (ring's) would then rebuild everything on every other run.
  for var in $(compgen -e | grep -E '^CARGO_(PKG_|MANIFEST_|CRATE_|BIN_|PRIMARY_|TARGET_TMPDIR)' || true); do
    unset "$var"
  done
  # ring compiles C: with musl's gcc wrapper (Debian's musl-tools).
  CC_x86_64_unknown_linux_musl=${CC_x86_64_unknown_linux_musl:-musl-gcc} \
  CARGO_TARGET_DIR=$MUSL_TARGET_DIR cargo build --quiet --release --locked --target "$TARGET" \
    -p hoststack-operator -p hoststack-agent --features hoststack-agent/test-hooks >&2
  BINARIES=$MUSL_TARGET_DIR/$TARGET/release
else
  BINARIES=$HOSTSTACK_IMAGE_BINARIES
fi

context=$(mktemp -d)
storage=$(mktemp -d -p "$CACHE" buildah.XXXXXX)
trap 'rm -rf "$context"; buildah --storage-driver vfs --root "$storage/root" --runroot "$storage/run" rmi --all >/dev/null 2>&1 || true; rm -rf "$storage"' EXIT
mkdir -p "$context/rootfs/usr/local/bin" "$OUT"
for bin in hoststack-operator hoststack-agent; do
  cp "$BINARIES/$bin" "$context/rootfs/usr/local/bin/$bin"
  strip "$context/rootfs/usr/local/bin/$bin"
  # A dynamically linked binary brings its libraries (and the loader) along.
  for lib in $(ldd "$BINARIES/$bin" 2>/dev/null | grep -o '/[^ ]*' || true); do
    mkdir -p "$context/rootfs$(dirname "$lib")"
    cp -L "$lib" "$context/rootfs$lib"
  done
done
gcc -static -Os -Wall -Werror -o "$context/pause" e2e/pause/pause.c
strip "$context/pause"

buildah_() { buildah --storage-driver vfs --root "$storage/root" --runroot "$storage/run" "$@"; }
build() { # target, image, archive
  log "building $2 (Dockerfile target $1)"
  buildah_ bud --quiet --layers=false --target "$1" -f Dockerfile -t "$2" "$context" >/dev/null
  rm -f "$OUT/$3"
  buildah_ push --quiet "$2" "oci-archive:$OUT/$3:$2" >&2
}
build lab "$IMAGE" hoststack.oci
build lab-pause "$PAUSE_IMAGE" pause.oci
echo "$OUT"
