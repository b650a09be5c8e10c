//! `--agent-image`: the agent run from the image's own root filesystem, as the DaemonSet runs
//! it, without a container engine. The OCI archive is unpacked once per lab run; each agent then
//! gets a private mount namespace inside its node's network namespace, the root bound
//! read-only, `/proc`, `/sys`, `/dev/null` and a small tmpfs on `/run` (where the kubeconfig
//! goes, as a pod's service account token would), and runs chrooted as UID 0 holding only
//! `CAP_NET_ADMIN`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::sys::RUN_DIR;

/// Where the kubeconfig appears inside the image's root.
pub const KUBECONFIG_IN_IMAGE: &str = "/run/kuport/kubeconfig";

/// An unpacked agent image, removed when dropped (unless [`AgentImage::keep`]).
#[derive(Debug)]
pub struct AgentImage {
    /// The image's root filesystem.
    pub root: PathBuf,
    /// The image's entrypoint (the agent binary), from its config.
    pub entrypoint: String,
    dir: PathBuf,
}

impl Drop for AgentImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directory images are unpacked into (`kuport-lab down` removes it).
pub fn unpack_dir() -> PathBuf {
    Path::new(RUN_DIR).join("agent-image")
}

impl AgentImage {
    /// Leaves the unpacked image in place for a kept lab, whose agents still run from it.
    pub fn keep(self) {
        std::mem::forget(self);
    }

    /// Unpacks `archive` (an OCI archive, as `deploy/image/build-local.sh` writes) under the
    /// lab's run directory: its index, manifest, config and layers in order.
    pub fn unpack(archive: &Path) -> Result<Self> {
        let dir = unpack_dir();
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("removing the old {}", dir.display()))?;
        }
        let oci = dir.join("oci");
        let root = dir.join("rootfs");
        for d in [&oci, &root] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let mut image = Self {
            root,
            entrypoint: String::new(),
            dir,
        };
        untar(archive, &oci)?;
        let index = read_json(&oci.join("index.json"))?;
        let manifest_digest = index["manifests"][0]["digest"]
            .as_str()
            .context("index.json names no manifest")?;
        let manifest = read_json(&blob(&oci, manifest_digest)?)?;
        let config_digest = manifest["config"]["digest"]
            .as_str()
            .context("the manifest names no config")?;
        let config = read_json(&blob(&oci, config_digest)?)?;
        image.entrypoint = config["config"]["Entrypoint"][0]
            .as_str()
            .context("the image config has no Entrypoint")?
            .to_owned();
        let layers = manifest["layers"]
            .as_array()
            .context("the manifest lists no layers")?;
        for layer in layers {
            let digest = layer["digest"].as_str().context("a layer without digest")?;
            // GNU tar detects gzip and zstd compression by itself when reading a file.
            untar(&blob(&oci, digest)?, &image.root)?;
        }
        let entrypoint = &image.entrypoint;
        if !image
            .root
            .join(entrypoint.trim_start_matches('/'))
            .is_file()
        {
            bail!("the image has no {entrypoint}");
        }
        Ok(image)
    }

    /// The program and arguments that run `agent_args` in this image, from inside a node's
    /// network namespace, with `kubeconfig` (a host path) visible at [`KUBECONFIG_IN_IMAGE`].
    /// The chain only execs, so the pid the lab records ends up being the agent's.
    pub fn command(&self, kubeconfig: &Path, agent_args: &[String]) -> (String, Vec<String>) {
        const SCRIPT: &str = r#"set -eu
root=$1; kubeconfig=$2; shift 2
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount -t proc proc "$root/proc"
mount -t sysfs -o ro sysfs "$root/sys"
mount --bind /dev/null "$root/dev/null"
mount -t tmpfs -o size=1m,mode=0755 tmpfs "$root/run"
mkdir "$root/run/kuport"
cp "$kubeconfig" "$root/run/kuport/kubeconfig"
exec chroot "$root" /usr/bin/setpriv --bounding-set=-all,+net_admin --inh-caps=-all -- "$@""#;
        let mut args: Vec<String> = vec![
            "--mount".into(),
            "--propagation".into(),
            "private".into(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            SCRIPT.into(),
            "sh".into(),
            self.root.display().to_string(),
            kubeconfig.display().to_string(),
            self.entrypoint.clone(),
        ];
        args.extend(agent_args.iter().cloned());
        ("unshare".into(), args)
    }
}

fn untar(archive: &Path, into: &Path) -> Result<()> {
    let out = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .output()
        .context("running tar")?;
    if !out.status.success() {
        bail!(
            "unpacking {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn blob(oci: &Path, digest: &str) -> Result<PathBuf> {
    let (algorithm, hex) = digest
        .split_once(':')
        .with_context(|| format!("digest {digest:?} has no algorithm"))?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("digest {digest:?} is not hex");
    }
    Ok(oci.join("blobs").join(algorithm).join(hex))
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}
