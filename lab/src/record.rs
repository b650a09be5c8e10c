//! The lab's record (`state.json` under the run directory): everything a run created, saved
//! after every change, so that teardown and `kuport-lab down` remove exactly that.

use serde::{Deserialize, Serialize};

/// One long-lived process the lab started.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcessRecord {
    pub pid: i32,
    /// `/proc/<pid>/comm` when it was started: `down` kills a pid only while it still names the
    /// same program, so a recycled pid is never hit.
    pub comm: String,
    pub what: String,
}

/// Everything a lab run created, saved after every change.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LabState {
    pub namespaces: Vec<String>,
    pub processes: Vec<ProcessRecord>,
    /// The lab created `/run/wireguard` as a mount point (and removes it again).
    pub created_run_wireguard: bool,
    /// Local cluster: cgroups the lab created, by name under every hierarchy's root (one per
    /// node, holding its runtime, kubelet and pods); their processes are killed and the
    /// cgroups removed.
    pub cgroups: Vec<String>,
    /// Local cluster: host-wide sysctls as they were before a kubelet changed them, restored.
    pub sysctls: Vec<SysctlRecord>,
    /// Local cluster: directories the lab created on the host (mount points for the nodes'
    /// private bind mounts), removed when empty, deepest first.
    pub host_dirs: Vec<String>,
    /// Local cluster: the nodes' data (containerd's images and snapshots, kubelet's root),
    /// removed whole.
    pub data_dirs: Vec<String>,
    /// The `kuport-lab` process whose run or cluster this is, while it runs: `kuport-lab down`
    /// refuses to pull the lab from under it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<ProcessRecord>,
}

impl LabState {
    /// Whether the record names nothing to remove.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.processes.is_empty()
            && !self.created_run_wireguard
            && self.cgroups.is_empty()
            && self.sysctls.is_empty()
            && self.host_dirs.is_empty()
            && self.data_dirs.is_empty()
    }
}

/// A sysctl's value before the lab (or a kubelet it started) changed it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SysctlRecord {
    /// `/proc/sys/...` path.
    pub path: String,
    pub value: String,
}
