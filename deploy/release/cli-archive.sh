#!/usr/bin/env bash
# Builds the kuport CLI for one Rust target and packs it as a release asset:
#   dist/cli/kuport-v<version>-<os>-<arch>.tar.gz          the binary `kuport` and LICENSE
#   dist/cli/kuport-v<version>-<os>-<arch>.tar.gz.sha256   "<hex>  <file>", as sha256sum prints
# The binary is also the kubectl plugin: kubectl runs `kubectl-kuport`, which krew links to
# `kuport` (a manual install copies or links it under that name; docs/development.md).
#
#   deploy/release/cli-archive.sh TARGET VERSION      e.g. aarch64-unknown-linux-gnu 0.2.0
set -euo pipefail
cd "$(dirname "$0")/../.."
usage="usage: $0 TARGET VERSION"
target=${1:?$usage}
version=${2:?$usage}
case "$target" in
    x86_64-unknown-linux-gnu) os=linux arch=amd64 ;;
    aarch64-unknown-linux-gnu)
        os=linux arch=arm64
        # Cross-compiled on an amd64 runner: the linker, and the C compiler ring (under rustls)
        # builds its assembly with (gcc-aarch64-linux-gnu), as in the Dockerfile.
        export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
        export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
        ;;
    x86_64-apple-darwin) os=darwin arch=amd64 ;;
    aarch64-apple-darwin) os=darwin arch=arm64 ;;
    *) echo "$0: no release platform for target $target" >&2; exit 2 ;;
esac
case "$version" in
    [0-9]*.[0-9]*.[0-9]*) ;;
    *) echo "$0: version $version is not X.Y.Z" >&2; exit 2 ;;
esac
cargo build --release --locked -p kuport --target "$target"
name=kuport-v$version-$os-$arch.tar.gz
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "${CARGO_TARGET_DIR:-target}/$target/release/kuport" LICENSE "$stage/"
mkdir -p dist/cli
tar -C "$stage" -czf "dist/cli/$name" kuport LICENSE
cd dist/cli
# macOS has shasum, not sha256sum; both print "<hex>  <file>".
if command -v sha256sum >/dev/null; then sha256sum "$name"; else shasum -a 256 "$name"; fi > "$name.sha256"
echo "wrote dist/cli/$name ($(cut -d' ' -f1 "$name.sha256"))"
