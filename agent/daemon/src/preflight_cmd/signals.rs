//! The signals that end a preflight early. Each one a caller or its terminal sends to stop a
//! command is caught from before the class is created, so the run deletes the class before it
//! exits: Ctrl-C (SIGINT), a CI timeout or `kill` (SIGTERM), a closed ssh session or terminal
//! (SIGHUP), Ctrl-\ (SIGQUIT). SIGKILL cannot be caught; the class's deadline covers it.

use anyhow::Context as _;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// The caught signals, by name. Once made, none of them ends the process: each is a message to
/// [`Signals::received`] (one that came before it is called is held until then).
pub struct Signals(Vec<(&'static str, Signal)>);

impl Signals {
    /// Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT from now on.
    pub fn catch() -> anyhow::Result<Self> {
        let kinds = [
            ("SIGINT", SignalKind::interrupt()),
            ("SIGTERM", SignalKind::terminate()),
            ("SIGHUP", SignalKind::hangup()),
            ("SIGQUIT", SignalKind::quit()),
        ];
        let caught = kinds
            .into_iter()
            .map(|(name, kind)| {
                signal(kind)
                    .with_context(|| format!("catching {name}"))
                    .map(|s| (name, s))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self(caught))
    }

    /// Waits for one of the signals; returns its name.
    pub async fn received(&mut self) -> &'static str {
        let waits = self.0.iter_mut().map(|(name, s)| {
            let name = *name;
            Box::pin(async move {
                s.recv().await;
                name
            })
        });
        futures_util::future::select_all(waits).await.0
    }
}
