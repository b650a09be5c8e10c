# Sourced by the image scripts: need_debs PACKAGE... installs the Debian packages named whose
# commands are missing when run as root on Debian or Ubuntu (as the lab installs its tools), and
# otherwise names the one command that does.
need_debs() {
    local missing=()
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        echo "missing ${missing[*]}: sudo apt-get install -y ${missing[*]}" >&2
        return 1
    fi
    echo "==> installing ${missing[*]} with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
