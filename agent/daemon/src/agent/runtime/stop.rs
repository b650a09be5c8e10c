//! What a stopping agent does with the datapath: under [`StopPolicy::Owner`] it learns its
//! DaemonSet while it runs and, at the stop, asks whether kuport is being removed.

use std::time::Duration;

use kuport_host::Host;
use tokio::task::JoinHandle;

use super::Agent;
use crate::agent::lifecycle::{self, Lookup, RemovalWatch, StopAction, StopPolicy};

/// How long each read deciding a stop may take (three reads fit well inside the DaemonSet's
/// termination grace period).
const STOP_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// The DaemonSet owning this agent and the watch for its removal, once learnt.
type OwnerTask = JoinHandle<Option<(lifecycle::Owner, RemovalWatch)>>;

impl<H: Host> Agent<H> {
    /// Under [`StopPolicy::Owner`], reads the agent's own Pod in the background (retrying until
    /// it answers) to learn the DaemonSet owning it, then watches that DaemonSet and its
    /// namespace for a sign of removal (the watch lives in the task's result until the stop).
    pub(super) fn learn_owner(&self) -> Option<OwnerTask> {
        let StopPolicy::Owner { pod, namespace } = self.config.stop_policy.clone() else {
            return None;
        };
        let client = self.client.clone();
        let health = self.health.clone();
        let timeout = self.config.api_timeout;
        let (retry_min, retry_max) = (self.config.retry_min, self.config.retry_max);
        Some(tokio::spawn(async move {
            let mut delay = retry_min;
            loop {
                match lifecycle::read_owner(&client, &pod, &namespace, timeout).await {
                    Lookup::Found(owner) => {
                        match &owner {
                            Some(o) => tracing::info!(
                                "running as Pod {namespace}/{pod} of DaemonSet {}/{}",
                                o.namespace,
                                o.name
                            ),
                            None => tracing::warn!(
                                "Pod {namespace}/{pod} has no DaemonSet owner: a stop will keep the datapath"
                            ),
                        }
                        return owner.map(|o| {
                            let watch = lifecycle::watch_removal(&client, &o, &health);
                            (o, watch)
                        });
                    }
                    Lookup::NotFound | Lookup::Denied | Lookup::Unauthorized => {
                        tracing::warn!(
                            "cannot read the agent's own Pod {namespace}/{pod}: removing kuport \
                             will not clean this node by itself (grant get on pods and \
                             daemonsets in {namespace}, or run `kuport cleanup`)"
                        );
                        return None;
                    }
                    Lookup::Failed(e) => {
                        tracing::debug!("reading Pod {namespace}/{pod}: {e}; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(retry_max);
                    }
                    Lookup::NotAsked => return None,
                }
            }
        }))
    }

    /// What the stop does with the datapath, as `config.stop_policy` says; under
    /// [`StopPolicy::Owner`], from what the owner lookup learnt and a few bounded reads now.
    pub(super) async fn stop_action(&self, owner_task: Option<OwnerTask>) -> StopAction {
        match &self.config.stop_policy {
            StopPolicy::Keep => StopAction::Keep("the next agent adopts it".to_owned()),
            StopPolicy::Teardown => StopAction::Teardown("configured to".to_owned()),
            StopPolicy::Owner { pod, namespace } => {
                // A lookup still running gets the same bounded time as the stop's own
                // lookups, rather than being dropped because the stop came early.
                let learnt = match owner_task {
                    Some(mut task) => {
                        let bound = self.config.api_timeout.min(STOP_LOOKUP_TIMEOUT);
                        match tokio::time::timeout(bound, &mut task).await {
                            Ok(found) => found.ok().flatten(),
                            Err(_) => {
                                task.abort();
                                None
                            }
                        }
                    }
                    None => None,
                };
                let (owner_at_start, seen_removal) = match learnt {
                    Some((owner, watch)) => (Some(owner), watch.seen()),
                    None => (None, None),
                };
                let facts = lifecycle::gather(
                    &self.client,
                    pod,
                    namespace,
                    owner_at_start,
                    seen_removal,
                    self.config.api_timeout.min(STOP_LOOKUP_TIMEOUT),
                )
                .await;
                tracing::debug!(?facts, "deciding what to do with the datapath");
                lifecycle::decide(&facts)
            }
        }
    }
}
