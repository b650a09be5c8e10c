//! `/healthz`, `/readyz` and `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::metrics::Metrics;

/// Liveness and readiness, shared between the pass loop and the HTTP handlers.
#[derive(Clone, Debug, Default)]
pub struct Health {
    alive: Arc<AtomicBool>,
    ready: Arc<AtomicBool>,
    /// The watches of the agent's own DaemonSet and namespace have listed once (a removal from
    /// now on is seen).
    watching_removal: Arc<AtomicBool>,
    /// One of those watches saw a sign of removal.
    removal_seen: Arc<AtomicBool>,
    /// The loop owes nothing: see [`Health::is_settled`].
    settled: Arc<AtomicBool>,
}

impl Health {
    /// True while the pass loop runs.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// True once a pass has completed without failure (it stays true afterwards: a later
    /// failure keeps the last applied state serving, which is still ready).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// True once the agent watches its own DaemonSet and namespace (both listed once), so that
    /// their removal from now on decides what a stop does.
    pub fn is_watching_removal(&self) -> bool {
        self.watching_removal.load(Ordering::SeqCst)
    }

    /// True once those watches saw the DaemonSet or the namespace removed.
    pub fn has_seen_removal(&self) -> bool {
        self.removal_seen.load(Ordering::SeqCst)
    }

    /// True while the pass loop waits with nothing owed: no pass running or about to run, no
    /// pass's status writes still with the status task (sent, waiting for an answer, or not
    /// sent yet), no write held back for a later pass and no retry due. What the simulator and
    /// the scale harness wait for before they call the cluster quiet: a host that matches the
    /// plan says nothing of the writes still on their way.
    pub fn is_settled(&self) -> bool {
        self.settled.load(Ordering::SeqCst)
    }

    pub(crate) fn set_settled(&self, settled: bool) {
        self.settled.store(settled, Ordering::SeqCst);
    }

    pub(crate) fn set_watching_removal(&self) {
        self.watching_removal.store(true, Ordering::SeqCst);
    }

    pub(crate) fn set_removal_seen(&self) {
        self.removal_seen.store(true, Ordering::SeqCst);
    }

    pub(crate) fn set_alive(&self, alive: bool) {
        self.alive.store(alive, Ordering::SeqCst);
    }

    pub(crate) fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }
}

/// `/healthz` and `/readyz`: 200 `ok` or 503 with the reason.
pub fn health_router(health: Health) -> Router {
    let live = health.clone();
    Router::new()
        .route(
            "/healthz",
            get(move || async move {
                if live.is_alive() {
                    (StatusCode::OK, "ok\n")
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the pass loop is not running\n",
                    )
                }
            }),
        )
        .route(
            "/readyz",
            get(move || async move {
                if health.is_ready() {
                    (StatusCode::OK, "ok\n")
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "no pass has completed yet\n",
                    )
                }
            }),
        )
}

/// `/metrics` in the OpenMetrics text format.
pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || async move {
            match metrics.encode() {
                Ok(text) => (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    text,
                )
                    .into_response(),
                Err(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "encoding the metrics failed\n",
                )
                    .into_response(),
            }
        }),
    )
}

/// Serves `router` on `addr` until the listener fails; binding errors name the address.
pub async fn serve(addr: SocketAddr, what: &'static str, router: Router) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("binding the {what} endpoint on {addr}: {e}"))?;
    axum::serve(listener, router)
        .await
        .map_err(|e| format!("serving the {what} endpoint on {addr}: {e}"))
}
