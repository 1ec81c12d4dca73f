#!/usr/bin/env bash
# Idempotent set-up of a fresh machine (Debian, root) for the lab and the tests: Debian
# packages, the control plane built from its Go modules (cached outside the repo), and the
# workspace's binaries. Needs Go >= 1.24 and a Rust toolchain; both are looked for in their
# usual places when not on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[setup] $*" >&2; }

# Toolchains installed the usual way but not on a non-login shell's PATH.
for dir in /usr/local/go/bin "$HOME/go/bin" "$HOME/.cargo/bin"; do
  case ":$PATH:" in *":$dir:"*) ;; *) if [ -d "$dir" ]; then PATH="$PATH:$dir"; fi ;; esac
done
export PATH

if [ "$(id -u)" != 0 ]; then
  log "the lab needs root (network namespaces, veths, a bridge); run as root"
  exit 1
fi

# iproute2: ip netns/link/addr; openssl: the lab's PKI; procps: sysctl; util-linux: nsenter.
# prometheus (with promtool), iperf3: the metrics e2e test; prometheus-node-exporter: the
# scrape benchmark (node-agent/benches/scrape.rs). clang, llvm, libbpf-dev: the agent's build
# compiles its XDP programs (node-agent/build.rs); iputils-ping: the XDP tests' blocked pings.
# nftables (the nft tool): the firewall tests read the agent's table with `nft list`; clang's
# libclang and libc6-dev's kernel headers: rustables' build script runs bindgen over them.
# ethtool: the NIC tests check channels and offloads independently of the agent's netlink.
# qemu-system-x86, busybox-static, kmod, cpio, zstd: the lab's VM node (its kernel, initramfs
# and modules); dpdk, dpdk-dev, librte-net-virtio23: DPDK in the VM node and userstack's `dpdk`
# feature. buildah, runc, containernetworking-plugins: images and real kubelet nodes. curl, wrk:
# real HTTP clients against the user-space stack. musl-tools: the lab image's static binaries
# (scripts/build-images.sh; ring's C code is compiled with musl-gcc). python3: the VM node's
# guest sets its clock from the host's with it (e2e/src/vm/initramfs.rs). jq: scripts/test reads
# cargo's JSON messages with it.
PACKAGES=(iproute2 nftables openssl procps util-linux psmisc ca-certificates git gcc libc6-dev pkg-config
  prometheus iperf3 prometheus-node-exporter clang llvm libbpf-dev iputils-ping ethtool
  qemu-system-x86 busybox-static kmod cpio zstd dpdk dpdk-dev librte-net-virtio23
  buildah runc containernetworking-plugins curl wrk musl-tools python3 jq)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

command -v go >/dev/null || {
  log "Go (>= 1.24) is needed to build etcd, kube-apiserver, kubectl and helm; install it (https://go.dev/doc/install) and run again"
  exit 1
}
command -v cargo >/dev/null || {
  log "a Rust toolchain is needed (https://rustup.rs); install it and run again"
  exit 1
}

# scripts/test gates on formatting and lints.
for component in rustfmt clippy; do
  if command -v rustup >/dev/null && ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
    log "adding the $component component"
    rustup component add "$component" >&2
  fi
done

CONTROL_PLANE_BIN=$(scripts/build-control-plane.sh)
log "control plane binaries in $CONTROL_PLANE_BIN"

# The dashboards' schema check (e2e/tests/dashboard_schema.rs): Grafana's dashboard schema as
# the Grafana foundation SDK's Go module carries it, pinned by scripts/dashboard-schema/go.sum.
# Go caches the module and the build outside the repo; the program goes beside helm.
log "building the dashboards' schema check"
(cd scripts/dashboard-schema && GOTOOLCHAIN=local GOFLAGS=-mod=readonly \
  go build -o "$CONTROL_PLANE_BIN/dashboard-schema.tmp" .)
mv "$CONTROL_PLANE_BIN/dashboard-schema.tmp" "$CONTROL_PLANE_BIN/dashboard-schema"

# The lab's agent carries its test hooks (hoststack-agent's `test-hooks` feature: --step-delay,
# the DPDK unbind pause), which the end-to-end tests use; a user's build has none (Dockerfile).
log "building the workspace's binaries (the agent with its test hooks)"
cargo build --workspace --bins --features hoststack-agent/test-hooks --quiet
