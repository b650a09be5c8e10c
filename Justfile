# Recipes for working on kuport. Each is a thin wrapper over a cargo command that also runs
# without just; CI runs the same commands through .ci/run.

# The real control plane for the real-server tests: etcd, kube-apiserver and
# kube-controller-manager built from e2e/controlplane (Go) into
# /var/cache/kuport/controlplane/<kubernetes version>; does nothing when they are there.
control-plane:
    bash e2e/controlplane/build.sh

# Unit, golden, CRD-drift, real-server (when built) and (as root) kernel tests.
test:
    cargo test --workspace

# Regenerate crds/ from the Rust types.
crds:
    cargo run --quiet -p kuport -- crds --out crds

# Format every crate.
fmt:
    cargo fmt --all

# Lint with warnings denied, as CI does.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings

# The network-namespace lab: every scenario in lab/scenarios/ (needs root).
lab:
    cargo lab

# The lab's measurements, written into docs/performance.md (needs root).
bench:
    cargo run --quiet --release -p kuport-lab -- bench --write docs/performance.md
