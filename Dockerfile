# syntax=docker/dockerfile:1
# hoststack's image: hoststack-operator and hoststack-agent in one image. The chart runs the
# operator from it and the operator gives it to the agent DaemonSet. One image rather than two:
# one tag to pin and one pull per node, and the chart passes the same reference to both; the
# two programs still run with different rights (the chart runs the operator as user 65532 with
# every capability dropped; the agent's pod is privileged on the host network). The agent is
# GPL-3.0-or-later (it links rustables), the operator Apache-2.0: see README.md, Licences.
#
#   docker build -t ghcr.io/hoststack/hoststack:dev .                  # users: builds from source
#   scripts/build-images.sh                                            # the lab: no registry
#
# Layout (both paths): /usr/local/bin/hoststack-operator (the chart's operator command) and
# /usr/local/bin/hoststack-agent (the command of the agent DaemonSet the operator creates).

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS builder
# The agent's build compiles its XDP programs (node-agent/bpf/*.c) with clang against libbpf's
# headers.
RUN apt-get update \
 && apt-get install -y --no-install-recommends clang llvm libbpf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# No `--features hoststack-agent/test-hooks`: the users' agent has no test hooks (no
# --step-delay, no HOSTSTACK_DPDK_UNBIND_PAUSE); node-agent/tests/test_hooks.rs proves it. The
# release profile (Cargo.toml) leaves no debug sections in the binaries: every node pulls them
# (docs/image.md, Debug sections); e2e/tests/user_image.rs proves it.
RUN cargo build --release --locked -p hoststack-operator -p hoststack-agent \
 && mkdir -p /out/usr/local/bin \
 && cp target/release/hoststack-operator target/release/hoststack-agent /out/usr/local/bin/

# The lab's images, built by scripts/build-images.sh with buildah from a context directory it
# fills on the host (static musl binaries, a static pause program): nothing is pulled. Its agent
# is built with the test hooks (hoststack-agent's `test-hooks` feature) that the lab's tests use.
FROM scratch AS lab
COPY rootfs/ /
LABEL org.opencontainers.image.title="hoststack (lab build)" \
      org.opencontainers.image.source="https://github.com/hoststack/hoststack" \
      org.opencontainers.image.description="hoststack operator and node agent, static binaries" \
      org.opencontainers.image.licenses="Apache-2.0 AND GPL-3.0-or-later"
ENTRYPOINT ["/usr/local/bin/hoststack-operator"]

# The lab nodes' sandbox image: one static program that holds a pod's namespaces, reaps
# children and exits on SIGTERM (e2e/pause/pause.c).
FROM scratch AS lab-pause
COPY pause /pause
LABEL org.opencontainers.image.title="hoststack lab pause" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/pause"]

# Users' image (the default target). Both programs are self-contained Rust binaries that shell
# out to nothing and verify the API server with the CA from their kubeconfig or service
# account, so the runtime needs only glibc: no packages are installed.
FROM debian:${DEBIAN_RELEASE}-slim AS runtime
COPY --from=builder /out/ /
LABEL org.opencontainers.image.title="hoststack" \
      org.opencontainers.image.source="https://github.com/hoststack/hoststack" \
      org.opencontainers.image.description="hoststack operator and node agent" \
      org.opencontainers.image.licenses="Apache-2.0 AND GPL-3.0-or-later"
# No USER here: the agent must be root on its node; the chart runs the operator as 65532
# (runAsNonRoot, all capabilities dropped, read-only root filesystem).
ENTRYPOINT ["/usr/local/bin/hoststack-operator"]
