#!/usr/bin/env bash
# Builds Cilium from the version pinned in go.mod/go.sum into a cache outside the repository,
# keyed by that version, and does nothing when that cache entry is complete: cilium-agent,
# cilium-operator-generic, cilium-cni and cilium-dbg, and the module's bpf/ sources, which the
# agent compiles with clang at run time (it reads them from <lib-dir>/bpf; the local cluster
# gives each agent a --lib-dir whose bpf/ points here).
# Prints the directory holding them on its last line.
#
#   KUPORT_CILIUM_CACHE  cache root (default /var/cache/kuport/cilium)
#   KUPORT_CILIUM_JOBS   go build -p (default: the number of CPUs)
set -euo pipefail
cd "$(dirname "$0")"

command -v go >/dev/null 2>&1 || { echo "cilium: no go toolchain on PATH" >&2; exit 1; }
version=$(go list -m -f '{{.Version}}' github.com/cilium/cilium)
# Named by the Cilium version; the digest of go.mod, go.sum and the stubs inside it tells a
# rebuild is due when the pins or the substitutions change.
sum=$(cat go.mod go.sum stub/*/* | sha256sum | cut -c1-16)
root=${KUPORT_CILIUM_CACHE:-/var/cache/kuport/cilium}
dir=$root/$version
bins=(cilium-agent cilium-operator-generic cilium-cni cilium-dbg)

complete() {
    local b
    for b in "${bins[@]}"; do [ -x "$dir/$b" ] || return 1; done
    [ -f "$dir/bpf/bpf_lxc.c" ] || return 1
    [ "$(cat "$dir/PINS" 2>/dev/null)" = "$sum" ]
}

if complete; then
    echo "cilium: reusing $dir ($(cat "$dir/BUILT"))" >&2
    echo "$dir"
    exit 0
fi

mkdir -p "$root"
tmp=$(mktemp -d "$root/.build.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
src=$(go list -m -f '{{.Dir}}' github.com/cilium/cilium)
[ -n "$src" ] && [ -d "$src/bpf" ] || { echo "cilium: module source not downloaded ($src)" >&2; exit 1; }
# The version the binaries report, as Cilium's Makefile sets it (without a git commit).
ldflags="-s -w -X github.com/cilium/cilium/pkg/version.ciliumVersion=${version#v}"
# osusergo as Cilium's Makefile; ipam_provider_operator is what makes the operator "generic"
# (cluster-pool and Kubernetes IPAM, no cloud providers). The tag touches no other binary.
tags=osusergo,ipam_provider_operator
echo "cilium: building cilium $version into $dir" >&2
GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath -mod=readonly" CGO_ENABLED=0 \
    nice -n 10 go build -p "${KUPORT_CILIUM_JOBS:-$(nproc)}" -tags "$tags" -ldflags "$ldflags" \
    -o "$tmp/" \
    github.com/cilium/cilium/daemon \
    github.com/cilium/cilium/operator \
    github.com/cilium/cilium/plugins/cilium-cni \
    github.com/cilium/cilium/cilium-dbg
# go names each binary after the last element of its package path.
mv "$tmp/daemon" "$tmp/cilium-agent"
mv "$tmp/operator" "$tmp/cilium-operator-generic"
for b in "${bins[@]}"; do
    [ -x "$tmp/$b" ] || { echo "cilium: go build produced no $b" >&2; exit 1; }
done
# The agent compiles its datapath from these at run time, from <lib-dir>/bpf
# (/var/lib/cilium/bpf in Cilium's image).
cp -r "$src/bpf" "$tmp/bpf"
chmod -R u+w,go+rX "$tmp/bpf"
echo "$sum" >"$tmp/PINS"
echo "cilium $version, built in $((SECONDS - start))s on $(date -u +%FT%TZ)" >"$tmp/BUILT"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "cilium: built in $((SECONDS - start))s: $(du -sh "$dir" | cut -f1) ($(cd "$dir" && du -h "${bins[@]}" | tr '\t\n' ' '))" >&2
echo "$dir"
