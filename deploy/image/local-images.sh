#!/usr/bin/env bash
# The images a cluster without a registry needs, as docker archives that `ctr images import`
# (or `docker load`, `kind load image-archive`) loads under the names the manifests use:
#
#   OUT/agent.tar  ghcr.io/walzen-group/kuport-agent:v<version>  (the agent image given, renamed
#                  to the name deploy/manifests and the chart's defaults pull)
#   OUT/echo.tar   localhost/kuport-echo:e2e   the end-to-end workload: kuport-echo, answering
#                  every datagram and line with the address it saw
#   OUT/pause.tar  registry.k8s.io/pause:3.10  the sandbox image (`sleep infinity`)
#
# The workload and pause images are layered on the agent image, so a node stores its root
# filesystem once. Needs root, buildah and skopeo (Debian packages).
#
#   deploy/image/local-images.sh AGENT.oci.tar OUT-DIR [KUPORT-ECHO-BINARY]
set -euo pipefail
cd "$(dirname "$0")/../.."

agent=${1:?usage: local-images.sh AGENT.oci.tar OUT-DIR [KUPORT-ECHO-BINARY]}
out=${2:?usage: local-images.sh AGENT.oci.tar OUT-DIR [KUPORT-ECHO-BINARY]}
echo_bin=${3:-target/debug/kuport-echo}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
agent_name=ghcr.io/walzen-group/kuport-agent:v$version

# shellcheck source=deploy/image/need-debs.sh
. deploy/image/need-debs.sh
need_debs buildah skopeo binutils
[ -s "$agent" ] || { echo "no agent image at $agent (deploy/image/build-local.sh builds it)" >&2; exit 1; }
[ -x "$echo_bin" ] || { echo "no kuport-echo at $echo_bin (cargo build -p kuport-testkit)" >&2; exit 1; }
mkdir -p "$out"

# Without its debug information: every node imports and unpacks the image, and a debug build's
# symbols are most of its size.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
objcopy --strip-debug "$echo_bin" "$work/kuport-echo"
echo_bin=$work/kuport-echo

export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
skopeo copy --quiet "oci-archive:$agent" "docker-archive:$out/agent.tar.tmp:$agent_name"
mv "$out/agent.tar.tmp" "$out/agent.tar"

derive() {
    local name=$1 file=$2; shift 2
    local ctr
    ctr=$(buildah from --quiet "oci-archive:$agent")
    # shellcheck disable=SC2064
    trap "buildah rm $ctr >/dev/null 2>&1 || true" RETURN
    "$@" "$ctr"
    rm -f "$out/$file.tmp"
    buildah commit --quiet --rm "$ctr" "docker-archive:$out/$file.tmp:$name" >/dev/null
    mv "$out/$file.tmp" "$out/$file"
}

echo_config() {
    buildah config --cmd '' "$1"
    buildah copy --quiet --chmod 0755 "$1" "$echo_bin" /usr/local/bin/kuport-echo
    buildah config --entrypoint '["/usr/local/bin/kuport-echo"]' --cmd '' --user 65534 \
        --label org.opencontainers.image.title=kuport-echo "$1"
}
pause_config() {
    buildah config --cmd '' "$1"
    buildah config --entrypoint '["/bin/sleep", "infinity"]' --cmd '' --user 65534 \
        --label org.opencontainers.image.title=pause "$1"
}
derive localhost/kuport-echo:e2e echo.tar echo_config
derive registry.k8s.io/pause:3.10 pause.tar pause_config
echo "wrote $out: agent.tar ($agent_name), echo.tar (localhost/kuport-echo:e2e), pause.tar (registry.k8s.io/pause:3.10)"
