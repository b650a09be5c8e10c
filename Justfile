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

# The simulator: every scenario over 10,000 seeds each (CI runs 510 in all).
sim-long:
    KUPORT_SIM_SEEDS=10000 cargo test --release -p kuport-simulator --test scenarios -- --nocapture

# Regenerate crds/ and the chart's copy from the Rust types.
crds:
    cargo run --quiet -p kuport -- crds --out crds
    cargo run --quiet -p kuport -- crds --out deploy/chart/crds
    cargo run --quiet -p kuport -- crds --markdown --update docs/api.md

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

# The agent image as an OCI archive, built here without a registry (root; debootstrap, buildah).
image out="target/kuport-agent.oci.tar":
    deploy/image/build-local.sh {{out}}

# Run the image's binaries as the DaemonSet would: read-only root, NET_ADMIN only (root).
image-smoke archive="target/kuport-agent.oci.tar":
    deploy/image/smoke.sh {{archive}}

# Lab scenarios against the real control plane (root; `just control-plane` first).
lab-real *scenarios="lab/scenarios/cilium-tunnel-cross-node.yaml lab/scenarios/cilium-tunnel-multi.yaml lab/scenarios/cilium-tunnel-endpoints.yaml lab/scenarios/cilium-tunnel-node-failover.yaml lab/scenarios/cilium-tunnel-dual-stack-multi.yaml lab/scenarios/cilium-tunnel-dual-stack-endpoints.yaml":
    cargo lab run {{scenarios}} --apiserver real

# Lab scenarios with every agent run from the image (root); default: the cross-node ones.
lab-image archive="target/kuport-agent.oci.tar" *scenarios="lab/scenarios/cilium-tunnel-cross-node.yaml lab/scenarios/cilium-tunnel-multi.yaml":
    cargo lab run {{scenarios}} --agent-image {{archive}}

# The image for both architectures with docker buildx (GitHub Actions; no push).
image-multiarch tag="kuport-agent:ci":
    docker buildx build --platform linux/amd64,linux/arm64 --tag {{tag}} .

# The chart, checked by Helm (GitHub Actions; here the tests in e2e/tests/deploy.rs check it).
chart-lint:
    helm lint deploy/chart
    helm template kuport deploy/chart --namespace kuport-system > /dev/null
    helm template kuport deploy/chart --namespace kuport-system --set rbac.aggregate=false --set metrics.serviceMonitor.enabled=true > /dev/null

# The kind end-to-end run (kind, kubectl, docker); `just e2e --dry-run` prints its commands.
e2e *args:
    cargo e2e run {{args}}

# Release artifacts for version X.Y.Z, the image already pushed with digest sha256:...:
# kuport-X.Y.Z.yaml, crds-X.Y.Z.yaml and kuport-X.Y.Z.tgz in dist/.
release-artifacts version image digest:
    mkdir -p dist
    cargo e2e bundle --image {{image}}:v{{version}}@{{digest}} > dist/kuport-{{version}}.yaml
    cargo run --quiet -p kuport -- crds > dist/crds-{{version}}.yaml
    rm -rf dist/chart && cp -r deploy/chart dist/chart
    cargo e2e chart-digest --digest {{digest}} --values dist/chart/values.yaml
    sed -i 's|^  repository: .*|  repository: {{image}}|' dist/chart/values.yaml
    helm package dist/chart --version {{version}} --app-version {{version}} --destination dist

# Push a packaged chart to an OCI registry; the credentials come from the environment
# (REGISTRY_USER, REGISTRY_TOKEN), never from the command line.
chart-push chart registry:
    printf '%s' "$REGISTRY_TOKEN" | helm registry login "$(echo {{registry}} | cut -d/ -f3)" --username "$REGISTRY_USER" --password-stdin
    helm push {{chart}} {{registry}}

# The CLI for one Rust target of a release, packed with its checksum into dist/cli/
# (kuport-vX.Y.Z-<os>-<arch>.tar.gz and .sha256; the release workflow runs it per platform).
cli-archive target version:
    deploy/release/cli-archive.sh {{target}} {{version}}

# The krew plugin manifest of release X.Y.Z of OWNER/NAME, from the checksums in dist/cli/:
# dist/krew/kuport-krew.yaml (`kubectl krew install --manifest=dist/krew/kuport-krew.yaml`).
krew-manifest version repository:
    mkdir -p dist/krew
    cargo e2e krew-manifest --version {{version}} --repository {{repository}} dist/cli/*.sha256 > dist/krew/kuport-krew.yaml
