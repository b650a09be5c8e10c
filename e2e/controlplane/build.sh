#!/usr/bin/env bash
# Builds the test-time Kubernetes binaries from the versions pinned in go.mod/go.sum into a cache
# outside the repository, keyed by those versions, and does nothing when that cache entry is
# complete: the control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
# and the node (kubelet, kube-proxy) that the local cluster (`cargo e2e run --cluster local`)
# runs inside the lab's node namespaces. Prints the directory holding the binaries on its last
# line.
#
#   KUPORT_CONTROLPLANE_CACHE  cache root (default /var/cache/kuport/controlplane)
#   KUPORT_CONTROLPLANE_JOBS   go build -p (default: the number of CPUs)
set -euo pipefail
cd "$(dirname "$0")"

command -v go >/dev/null 2>&1 || { echo "control-plane: no go toolchain on PATH" >&2; exit 1; }
k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd_version=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
# The directory is named by the Kubernetes version (what the Rust test support looks for); the
# digest of go.mod and go.sum inside it tells a rebuild is due when the pins change otherwise.
sum=$(cat go.mod go.sum | sha256sum | cut -c1-16)
root=${KUPORT_CONTROLPLANE_CACHE:-/var/cache/kuport/controlplane}
dir=$root/$k8s_version
bins=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

complete() {
    local b
    for b in "${bins[@]}"; do [ -x "$dir/$b" ] || return 1; done
    [ "$(cat "$dir/PINS" 2>/dev/null)" = "$sum" ]
}

if complete; then
    echo "control-plane: reusing $dir ($(cat "$dir/BUILT"))" >&2
    echo "$dir"
    exit 0
fi

mkdir -p "$root"
tmp=$(mktemp -d "$root/.build.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
minor=${k8s_version#v1.}
minor=${minor%%.*}
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
echo "control-plane: building kubernetes $k8s_version and etcd $etcd_version into $dir" >&2
# One go build for all of them so the packages they share compile once; -trimpath and a fixed
# build date keep the binaries independent of this checkout's path and of the clock.
GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath -mod=readonly" CGO_ENABLED=0 \
    nice -n 10 go build -p "${KUPORT_CONTROLPLANE_JOBS:-$(nproc)}" -ldflags "$ldflags" -o "$tmp/" \
    go.etcd.io/etcd/server/v3 \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy
# go names the etcd server module's binary after its path without the major version: "server".
mv "$tmp/server" "$tmp/etcd"
for b in "${bins[@]}"; do
    [ -x "$tmp/$b" ] || { echo "control-plane: go build produced no $b" >&2; exit 1; }
done
echo "$sum" >"$tmp/PINS"
echo "kubernetes $k8s_version, etcd $etcd_version, built in $((SECONDS - start))s on $(date -u +%FT%TZ)" >"$tmp/BUILT"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "control-plane: built in $((SECONDS - start))s: $(du -sh "$dir" | cut -f1) ($(cd "$dir" && du -h "${bins[@]}" | tr '\t\n' ' '))" >&2
echo "$dir"
