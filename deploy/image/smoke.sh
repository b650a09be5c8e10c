#!/usr/bin/env bash
# Runs the agent image's own binaries as the DaemonSet would, without a container engine: the
# archive is unpacked with buildah, mounted read-only, entered with chroot in fresh mount and
# network namespaces, and run as UID 0 holding only CAP_NET_ADMIN. Checks `kuport version`,
# that nft is baked in, that `kuport cleanup` can talk to nftables and rtnetlink, and that the
# debugging tools the docs name (nft, ip, conntrack, a shell) work as a debug pod runs them.
#
#   deploy/image/smoke.sh [ARCHIVE.oci.tar]     (default: target/kuport-agent.oci.tar)
set -euo pipefail
cd "$(dirname "$0")/../.."
archive=${1:-target/kuport-agent.oci.tar}
[ "$(id -u)" -eq 0 ] || { echo "needs root: sudo $0 $*" >&2; exit 1; }
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
ctr=$(buildah from --quiet "oci-archive:$archive")
image=$(buildah inspect --format '{{.FromImageID}}' "$ctr")
# Leave nothing in buildah's storage: CI runs this on every build.
trap 'buildah umount "$ctr" >/dev/null 2>&1 || true; buildah rm "$ctr" >/dev/null 2>&1 || true; buildah rmi -f "$image" >/dev/null 2>&1 || true' EXIT
root=$(buildah mount "$ctr")

# In the namespaces: the root read-only, /proc and /dev/null for the tools, then every
# capability but NET_ADMIN dropped from the bounding set before exec.
unshare --mount --net --fork -- sh -eu -c '
    root=$1
    mount --bind "$root" "$root"
    mount -o remount,bind,ro "$root"
    mount -t proc proc "$root/proc"
    mount --bind /dev/null "$root/dev/null"
    run() { chroot "$root" /usr/bin/setpriv --bounding-set=-all,+net_admin --inh-caps=-all -- "$@"; }
    if touch "$root/probe" 2>/dev/null; then echo "the root filesystem is writable" >&2; exit 1; fi
    run /usr/local/bin/kuport version
    run /usr/sbin/nft --version
    run /usr/sbin/nft add table ip kuport
    run /usr/local/bin/kuport cleanup
    if run /usr/sbin/nft list table ip kuport >/dev/null 2>&1; then
        echo "kuport cleanup left table ip kuport" >&2; exit 1
    fi
    # The debugging commands docs/troubleshooting.md gives for `kubectl debug node/...
    # --profile=netadmin --image=<this image> -- sh`, run as that shell would run them.
    run /bin/sh -c "nft list ruleset >/dev/null && ip -br link && ip rule && ip route show table all >/dev/null && conntrack -L >/dev/null 2>&1 && conntrack --version && ip -V"
    # Control: without NET_ADMIN the same command is refused, so the drop above is real.
    if chroot "$root" /usr/bin/setpriv --bounding-set=-all --inh-caps=-all -- /usr/sbin/nft add table ip control 2>/dev/null; then
        echo "nft worked without NET_ADMIN: capabilities were not dropped" >&2; exit 1
    fi
' sh "$root"
echo "image smoke test passed: $archive"
