//! The `kuport` library: the node agent's runtime, usable from the binary and from tests that
//! run several agents in one process.

pub mod agent;

/// A Kubernetes client for `config`.
///
/// A plain-HTTP API endpoint (`kubectl proxy`, the lab's API server) needs no certificate
/// authority, but kube's TLS stack still loads the system's roots when the config names none,
/// and fails where there are none: the agent's image carries none (in a cluster the service
/// account's CA is given). Such a config gets an empty root store instead.
pub fn kube_client(mut config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.cluster_url.scheme_str() == Some("http") && config.root_cert.is_none() {
        config.root_cert = Some(Vec::new());
    }
    kube::Client::try_from(config)
}
