# kuport's agent image: the `kuport` binary and `nft`, nothing fetched at start; `ip` and
# `conntrack` beside them for a debug shell on a node (docs/troubleshooting.md).
#
# Multi-arch (linux/amd64, linux/arm64) with buildx: the build stage runs on the builder's own
# platform and cross-compiles for the target one, so no emulation is needed.
#   docker buildx build --platform linux/amd64,linux/arm64 -t kuport-agent .
# The agent runs as UID 0 with only NET_ADMIN (deploy/manifests/daemonset.yaml).

# The toolchain of rust-toolchain.toml (which .dockerignore leaves out: the image's own
# toolchain is that release, and the build needs neither rustfmt nor clippy). Base images are
# referred to by tag: pinning them by digest is to do (docs/development.md, "Releasing").
ARG RUST_VERSION=1.95.0
ARG DEBIAN_SUITE=bookworm

FROM --platform=$BUILDPLATFORM docker.io/library/rust:${RUST_VERSION}-${DEBIAN_SUITE} AS build
ARG TARGETARCH
# One cross toolchain for arm64 (ring, under rustls, compiles C for the target).
RUN set -eux; \
    case "$TARGETARCH" in \
      amd64) echo x86_64-unknown-linux-gnu > /rust-target ;; \
      arm64) echo aarch64-unknown-linux-gnu > /rust-target; \
             apt-get update; \
             apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross; \
             rm -rf /var/lib/apt/lists/* ;; \
      *) echo "unsupported TARGETARCH $TARGETARCH" >&2; exit 1 ;; \
    esac; \
    rustup target add "$(cat /rust-target)"
ENV CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p kuport --target "$(cat /rust-target)" \
    && cp "target/$(cat /rust-target)/release/kuport" /kuport

FROM docker.io/library/debian:${DEBIAN_SUITE}-slim
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE=https://github.com/walzen-group/kuport
RUN apt-get update \
    && apt-get install -y --no-install-recommends nftables iproute2 conntrack \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /kuport /usr/local/bin/kuport
LABEL org.opencontainers.image.title="kuport-agent" \
      org.opencontainers.image.description="kuport: TCP/UDP ports on a node's addresses delivered to a pod on any node, with the client's own address" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 0
ENTRYPOINT ["/usr/local/bin/kuport"]
CMD ["agent"]
