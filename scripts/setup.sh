#!/usr/bin/env bash
# Idempotent set-up of a fresh machine for the lab and the tests: Debian packages, the control
# plane built from its Go modules (cached outside the repo), and the workspace's binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(iproute2 nftables openssl procps util-linux psmisc ca-certificates)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

CONTROL_PLANE_BIN=$(scripts/build-control-plane.sh)
export HOSTSTACK_CONTROL_PLANE_BIN=$CONTROL_PLANE_BIN
echo "[setup] control plane binaries in $CONTROL_PLANE_BIN" >&2

cargo build --workspace --bins --quiet
