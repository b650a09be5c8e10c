//! kube clients over turmoil's simulated TCP: the agents reach the API server model through the
//! simulated network (so partitions and host crashes cut them off), every request counted and,
//! for the broken variants, rewritten on the wire.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Uri;
use http::request::Parts;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::client::{Body, ConfigExt};

/// The API server's host name and port in the simulation.
pub const API_HOST: &str = "api";
/// The port the model listens on.
pub const API_PORT: u16 = 6443;

/// Rewrites a request body of node `.0`'s agent on its way to the API server (a broken
/// variant's fault).
pub type Tamper = Arc<dyn Fn(&str, &Parts, Bytes) -> Bytes + Send + Sync>;

type Connecting = Pin<Box<dyn Future<Output = std::io::Result<SimStream>> + Send>>;

/// A simulated TCP connection as hyper wants it.
pub struct SimStream(TokioIo<turmoil::net::TcpStream>);

impl hyper::rt::Read for SimStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for SimStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Connection for SimStream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// Requests one node's agents made.
#[derive(Debug, Default)]
pub struct RequestCount {
    /// Every request.
    pub all: AtomicU64,
    /// Writes (anything but GET).
    pub writes: AtomicU64,
    /// The path of every status write (`.../status`), in order: who wrote which status.
    pub status_writes: std::sync::Mutex<Vec<String>>,
}

/// The model's listener on turmoil's simulated TCP.
pub struct SimListener(pub turmoil::net::TcpListener);

impl axum::serve::Listener for SimListener {
    type Io = turmoil::net::TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok(accepted) => return accepted,
                // A refused accept leaves the listener usable; wait a tick and go on.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(1)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A kube client, inside a turmoil host, to the model at [`API_HOST`]:[`API_PORT`].
pub fn client(node: &str, count: Arc<RequestCount>, tamper: Option<Tamper>) -> kube::Client {
    let node: Arc<str> = node.into();
    let connector = tower::service_fn(|_: Uri| -> Connecting {
        Box::pin(async {
            let stream = turmoil::net::TcpStream::connect((API_HOST, API_PORT)).await?;
            Ok(SimStream(TokioIo::new(stream)))
        })
    });
    let http: HyperClient<_, Body> = HyperClient::builder(TokioExecutor::new()).build(connector);
    let wire = tower::service_fn(move |req: http::Request<Body>| {
        let http = http.clone();
        let count = count.clone();
        let tamper = tamper.clone();
        let node = node.clone();
        async move {
            count.all.fetch_add(1, Ordering::Relaxed);
            if req.method() != http::Method::GET {
                count.writes.fetch_add(1, Ordering::Relaxed);
                let path = req.uri().path();
                if path.ends_with("/status") {
                    crate::sync::lock(&count.status_writes).push(path.to_owned());
                }
            }
            let req = match tamper {
                None => req,
                Some(tamper) => {
                    let (parts, body) = req.into_parts();
                    let bytes = body.collect().await?.to_bytes();
                    let bytes = tamper(&node, &parts, bytes);
                    http::Request::from_parts(parts, Body::from(bytes.to_vec()))
                }
            };
            http.request(req)
                .await
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        }
    });
    let url: Uri = format!("http://{API_HOST}:{API_PORT}")
        .parse()
        .unwrap_or_default();
    let config = kube::Config::new(url);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .service(wire);
    kube::Client::new(service, "default")
}
