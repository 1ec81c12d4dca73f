# syntax=docker/dockerfile:1
# hoststack's image: hoststack-operator and hoststack-agent in one image. The chart runs the
# operator from it and the operator gives it to the agent DaemonSet.
#
#   docker build -t ghcr.io/hoststack/hoststack:dev .

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
RUN cargo build --release --locked -p hoststack-operator -p hoststack-agent \
 && mkdir -p /out \
 && cp target/release/hoststack-operator target/release/hoststack-agent /out/

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
# The agent shells out to nothing for sysctls; nftables, iproute2 and ethtool are there for
# the knobs that later releases apply and for debugging a node from the agent's pod.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates iproute2 nftables ethtool \
 && rm -rf /var/lib/apt/lists/*
COPY --from=builder /out/hoststack-operator /out/hoststack-agent /usr/local/bin/
LABEL org.opencontainers.image.source="https://github.com/hoststack/hoststack" \
      org.opencontainers.image.description="hoststack operator and node agent" \
      org.opencontainers.image.licenses="Apache-2.0"
# The operator runs as non-root (the chart sets runAsUser); the agent needs root on the host.
ENTRYPOINT ["/usr/local/bin/hoststack-operator"]
