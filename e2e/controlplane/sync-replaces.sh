#!/usr/bin/env bash
# Pins this module to one Kubernetes release and derives everything else from that release:
#   - a `replace` for every staging module (k8s.io/api, k8s.io/apimachinery, ...) to the
#     matching published v0.X.Y, read from k8s.io/kubernetes's own go.mod (its
#     `k8s.io/<name> => ./staging/src/k8s.io/<name>` lines), never typed by hand;
#   - etcd's server module at the version that release's go.mod requires for the etcd client,
#     so the apiserver and etcd are built from one consistent dependency graph.
# Usage: sync-replaces.sh [v1.X.Y]   (default: the k8s.io/kubernetes version already in go.mod)
set -euo pipefail
cd "$(dirname "$0")"

k8s_version=${1:-$(go list -m -f '{{.Version}}' k8s.io/kubernetes)}
case $k8s_version in
    v1.*.*) ;;
    *) echo "sync-replaces: expected a version like v1.37.2, got '$k8s_version'" >&2; exit 1 ;;
esac
staging_version=v0.${k8s_version#v1.}

upstream_mod=$(go mod download -json "k8s.io/kubernetes@$k8s_version" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[ -r "$upstream_mod" ] || { echo "sync-replaces: no go.mod for k8s.io/kubernetes@$k8s_version" >&2; exit 1; }

staging=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\/src\// { print $1 }' "$upstream_mod" | sort -u)
[ -n "$staging" ] || { echo "sync-replaces: $upstream_mod lists no staging replace" >&2; exit 1; }
etcd_version=$(awk '$1 == "go.etcd.io/etcd/client/v3" { print $2; exit }' "$upstream_mod")
[ -n "$etcd_version" ] || { echo "sync-replaces: $upstream_mod requires no etcd client" >&2; exit 1; }

# Drop every replace this script wrote before, so a staging module the new release no longer has
# does not linger.
for old in $(go mod edit -json | sed -n 's/^[[:space:]]*"Path": "\(k8s\.io\/[^"]*\)",$/\1/p' | sort -u); do
    go mod edit -dropreplace "$old" 2>/dev/null || true
done
args=()
for module in $staging; do
    args+=("-replace=$module=$module@$staging_version")
done
go mod edit "${args[@]}"
go mod edit -require="k8s.io/kubernetes@$k8s_version" -require="go.etcd.io/etcd/server/v3@$etcd_version"
go mod tidy
echo "k8s.io/kubernetes $k8s_version: $(wc -w <<<"$staging") staging replaces to $staging_version; etcd $etcd_version"
