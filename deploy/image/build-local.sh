#!/usr/bin/env bash
# Builds the agent image without a container registry or daemon, into an OCI archive:
# a Debian root filesystem made by debootstrap with nftables, iproute2 and conntrack (the
# Dockerfile's final
# stage: the same suite and package), the kuport binary built here, the Dockerfile's labels,
# entrypoint and command. Needs root, debootstrap and buildah (Debian packages).
#
#   deploy/image/build-local.sh [OUT.oci.tar]     (default: target/kuport-agent.oci.tar)
#
# KUPORT_BIN=<path> packs that binary instead of building a release one (CI's smoke test packs
# the debug binary its tests already built).
#
# The debootstrapped root filesystem is cached under /var/cache/kuport/image/, keyed by suite,
# architecture and package list.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:-target/kuport-agent.oci.tar}
suite=$(sed -n 's/^ARG DEBIAN_SUITE=//p' Dockerfile)
arch=$(dpkg --print-architecture)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
packages=nftables,iproute2,conntrack
cache=/var/cache/kuport/image
rootfs_tar="$cache/rootfs-$suite-$arch-$packages.tar"

[ "$(id -u)" -eq 0 ] || { echo "debootstrap needs root: sudo $0 $*" >&2; exit 1; }
# shellcheck source=deploy/image/need-debs.sh
. deploy/image/need-debs.sh
need_debs debootstrap buildah

if [ ! -s "$rootfs_tar" ]; then
    echo "==> debootstrap $suite ($arch) with $packages into $rootfs_tar"
    mkdir -p "$cache"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    debootstrap --variant=minbase --include="$packages" "$suite" "$work/rootfs" >"$work/debootstrap.log" 2>&1 ||
        { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    # The Dockerfile's final stage keeps no apt lists or caches either.
    rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/"*.bin
    tar -C "$work/rootfs" -cf "$rootfs_tar.tmp" .
    mv "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf "$work"
    trap - EXIT
fi

if [ -n "${KUPORT_BIN:-}" ]; then
    bin=$KUPORT_BIN
    [ -x "$bin" ] || { echo "KUPORT_BIN=$bin is not an executable" >&2; exit 1; }
else
    echo "==> cargo build --release -p kuport"
    cargo build --release --locked --quiet -p kuport
    bin=target/release/kuport
fi

echo "==> assembling the image with buildah"
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
ctr=$(buildah from scratch)
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah add --quiet "$ctr" "$rootfs_tar" /
buildah copy --quiet --chmod 0755 "$ctr" "$bin" /usr/local/bin/kuport
buildah config \
    --entrypoint '["/usr/local/bin/kuport"]' --cmd agent --user 0 \
    --label org.opencontainers.image.title=kuport-agent \
    --label "org.opencontainers.image.source=https://github.com/walzen-group/kuport" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$revision" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    --os linux --arch "$arch" "$ctr"
mkdir -p "$(dirname "$out")"
rm -f "$out"
# The name deploy/manifests and the chart pull, so an archive loaded into a node runtime as it
# is (docker load, kind load image-archive, ctr images import) needs no override.
buildah commit --quiet --format oci "$ctr" "oci-archive:$out:ghcr.io/walzen-group/kuport-agent:v$version" >/dev/null
echo "wrote $out (ghcr.io/walzen-group/kuport-agent:v$version, $arch, $(du -h "$out" | cut -f1))"
