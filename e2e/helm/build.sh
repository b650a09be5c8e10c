#!/usr/bin/env bash
# Builds helm from the version pinned in go.mod/go.sum (a Go module of its own: helm brings its
# own dependency graph, which must not move the control plane's) into a cache outside the
# repository, keyed by that version, and does nothing when that cache entry is complete. The
# local cluster's end-to-end run installs the chart with it. Prints the binary's path on its
# last line.
#
#   KUPORT_HELM_CACHE  cache root (default /var/cache/kuport/helm)
set -euo pipefail
cd "$(dirname "$0")"

command -v go >/dev/null 2>&1 || { echo "helm: no go toolchain on PATH" >&2; exit 1; }
version=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
sum=$(cat go.mod go.sum | sha256sum | cut -c1-16)
root=${KUPORT_HELM_CACHE:-/var/cache/kuport/helm}
dir=$root/$version

if [ -x "$dir/helm" ] && [ "$(cat "$dir/PINS" 2>/dev/null)" = "$sum" ]; then
    echo "helm: reusing $dir ($(cat "$dir/BUILT"))" >&2
    echo "$dir/helm"
    exit 0
fi

mkdir -p "$root"
tmp=$(mktemp -d "$root/.build.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
echo "helm: building $version into $dir" >&2
GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath -mod=readonly" CGO_ENABLED=0 \
    nice -n 10 go build -p "${KUPORT_CONTROLPLANE_JOBS:-$(nproc)}" \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
    -o "$tmp/helm" helm.sh/helm/v4/cmd/helm
"$tmp/helm" version --short >/dev/null
echo "$sum" >"$tmp/PINS"
echo "helm $version, built in $((SECONDS - start))s on $(date -u +%FT%TZ)" >"$tmp/BUILT"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "helm: built in $((SECONDS - start))s: $(du -h "$dir/helm" | cut -f1)" >&2
echo "$dir/helm"
