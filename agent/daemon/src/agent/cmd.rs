//! `kuport agent`: flags, logging, the Kubernetes client, the real host, HTTP endpoints and
//! signals around the runtime.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use kuport_core::ir::MarkLayout;
use kuport_host::LinuxHost;
use kuport_host::probe::{LinkProber, ProbeSettings};
use tokio_util::sync::CancellationToken;

use super::health::{health_router, metrics_router, serve};
use super::lifecycle::StopPolicy;
use super::runtime::{Agent, AgentConfig};
use super::status::RowsIn;

/// Exit status when a second signal cuts the graceful shutdown short (128 + SIGINT, as shells
/// report an interrupted program).
const EXIT_SECOND_SIGNAL: i32 = 130;

/// Flags of `kuport agent`; every one also reads an environment variable.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// This node's name, as its Node object is named (the DaemonSet sets it from
    /// `spec.nodeName`).
    #[arg(long, env = "NODE_NAME", value_name = "NAME", value_parser = parse_node_name)]
    pub node_name: String,
    /// How often the host layer compares the kernel against the desired state (repairing
    /// hand-made drift) instead of against the last applied state: a number with a unit,
    /// `ms`, `s`, `m` or `h` (e.g. `30s`, `5m`, `1h`).
    #[arg(long, env = "KUPORT_RESYNC", value_name = "DURATION", default_value = "5m",
          value_parser = parse_duration)]
    pub resync: Duration,
    /// How often each return link is probed across (from this node's link address to the
    /// peer's, UDP port 4794 on link addresses only): three unanswered probes in a row report
    /// the link down in status. `0s` turns the probes off (the link is then reported by its
    /// ends' acknowledgements alone).
    #[arg(long, env = "KUPORT_LINK_PROBE_INTERVAL", value_name = "DURATION", default_value = "2s",
          value_parser = parse_duration_or_off)]
    pub link_probe_interval: Duration,
    /// Where `/healthz` and `/readyz` are served: `HOST:PORT`, or `:PORT` for the node's own
    /// address (--host-ip). `0.0.0.0:PORT` serves every address, public ones included.
    #[arg(long, env = "KUPORT_HEALTH_ADDR", value_name = "ADDR", default_value = ":8081",
          value_parser = parse_listen_addr)]
    pub health_addr: ListenAddr,
    /// Where `/metrics` (Prometheus/OpenMetrics text) is served: `HOST:PORT` or `:PORT`. May
    /// equal --health-addr, in which case one listener serves all three paths.
    #[arg(long, env = "KUPORT_METRICS_ADDR", value_name = "ADDR", default_value = ":9090",
          value_parser = parse_listen_addr)]
    pub metrics_addr: ListenAddr,
    /// The node's own address, which `:PORT` listen addresses bind to (the DaemonSet sets it
    /// from the pod's `status.hostIP`, the node's InternalIP). Without it they bind to
    /// 127.0.0.1: never to every address of an internet-facing node by accident.
    #[arg(long, env = "KUPORT_HOST_IP", value_name = "IP")]
    pub host_ip: Option<IpAddr>,
    /// The local mark kuport writes (inside --mark-mask); link marks follow it.
    #[arg(long, env = "KUPORT_MARK_BASE", value_name = "MARK", default_value = "0x1",
          value_parser = parse_mark)]
    pub mark_base: u32,
    /// The packet and conntrack mark bits kuport owns (one contiguous run). It must not overlap
    /// kube-proxy (0xc000), Cilium (0x0f00), Calico (0xffff0000), netbird (0x1bd00) or Tailscale
    /// (0xff0000): the agent refuses to start otherwise.
    #[arg(long, env = "KUPORT_MARK_MASK", value_name = "MASK", default_value = "0xff",
          value_parser = parse_mark)]
    pub mark_mask: u32,
    /// Lets the mark mask overlap another datapath's bits. Only for proving such a collision in
    /// the lab: in a cluster it breaks the other datapath or kuport.
    #[arg(long, env = "KUPORT_ALLOW_MARK_OVERLAP", hide = true)]
    pub allow_mark_overlap: bool,
    /// Where this node writes its rows of the classes (its addresses, checks, held ports and
    /// link ends): `class`, into each class's status, or `node`, into its own PortMapNode,
    /// which no other node writes and which has no bound of 512 link ends. Agents read both,
    /// so a rollout may mix them; set `node` once every agent runs this version.
    #[arg(long, env = "KUPORT_ROWS_IN", value_enum, value_name = "WHERE",
          default_value_t = RowsIn::Class)]
    pub rows_in: RowsIn,
    /// The least severe log level printed.
    #[arg(long, env = "KUPORT_LOG_LEVEL", value_enum, value_name = "LEVEL",
          default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
    /// `text` for people, `json` (one object per line) for log collectors.
    #[arg(long, env = "KUPORT_LOG_FORMAT", value_enum, value_name = "FORMAT",
          default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// A kubeconfig file, for running outside the cluster; without it the in-cluster service
    /// account is used.
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The agent's own Pod (the DaemonSet sets it from `metadata.name`). With --pod-namespace,
    /// a stop removes the datapath only when the DaemonSet owning this Pod is being deleted or
    /// is gone; without them a stop always keeps the datapath for the next agent.
    #[arg(long, env = "POD_NAME", value_name = "NAME", requires = "pod_namespace",
          value_parser = parse_object_name)]
    pub pod_name: Option<String>,
    /// The agent's own Pod's namespace (the DaemonSet sets it from `metadata.namespace`).
    #[arg(long, env = "POD_NAMESPACE", value_name = "NAMESPACE", requires = "pod_name",
          value_parser = parse_object_name)]
    pub pod_namespace: Option<String>,
}

/// Log levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Errors and warnings (failed passes, failed watches).
    Warn,
    /// Plus start, stop and one line per applied change.
    Info,
    /// Plus every pass, status write and event.
    Debug,
    /// Plus the Kubernetes client's requests.
    Trace,
}

/// Log formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Runs the agent until SIGTERM or SIGINT, then stops as its stop policy says and returns.
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    init_logging(args.log_level, args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: AgentArgs) -> anyhow::Result<()> {
    let marks = checked_marks(&args)?;
    let client = make_client(args.kubeconfig.as_deref()).await?;
    let host = LinuxHost::new()
        .context("opening the host's netlink socket")?
        .with_marks(marks);
    let mut config = AgentConfig::new(args.node_name.clone());
    config.resync = args.resync;
    config.marks = marks;
    config.rows_in = args.rows_in;
    let own = args.host_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    if args.host_ip.is_none() {
        tracing::warn!(
            "no --host-ip (KUPORT_HOST_IP): health and metrics given as :PORT listen on 127.0.0.1 only"
        );
    }
    let health_addr = args.health_addr.resolve(own);
    let metrics_addr = args.metrics_addr.resolve(own);
    config.agent_ports = vec![health_addr.port(), metrics_addr.port()];
    config.stop_policy = stop_policy(args.pod_name.clone(), args.pod_namespace.clone());
    let events = host.events();
    let agent = with_probes(
        Agent::new(client, host, config)
            .with_host_watch(Box::new(move |underlay| events.open(underlay))),
        args.link_probe_interval,
    );

    let health = health_router(agent.health());
    let metrics = metrics_router(agent.metrics());
    let mut servers = Vec::new();
    if health_addr == metrics_addr {
        servers.push(tokio::spawn(serve(
            health_addr,
            "health and metrics",
            health.merge(metrics),
        )));
    } else {
        servers.push(tokio::spawn(serve(health_addr, "health", health)));
        servers.push(tokio::spawn(serve(metrics_addr, "metrics", metrics)));
    }

    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    tracing::info!(
        node = %args.node_name,
        health = %health_addr,
        metrics = %metrics_addr,
        resync = ?args.resync,
        "kuport agent {} starting",
        env!("CARGO_PKG_VERSION")
    );

    // An endpoint that cannot bind is fatal (a probe would never answer); otherwise the agent
    // runs until a signal.
    let run = agent.run(shutdown.clone());
    tokio::pin!(run);
    let mut servers = futures_util::future::select_all(servers);
    let result = tokio::select! {
        r = &mut run => r.map_err(anyhow::Error::from),
        (ended, _, _) = &mut servers => {
            let error = match ended {
                Ok(Ok(())) => anyhow::anyhow!("an HTTP endpoint stopped"),
                Ok(Err(e)) => anyhow::anyhow!(e),
                Err(e) => anyhow::anyhow!("an HTTP endpoint task failed: {e}"),
            };
            // Still stop as a signal would (keeping or removing the datapath) before failing.
            shutdown.cancel();
            run.await.map_err(anyhow::Error::from).and(Err(error))
        }
    };
    if result.is_ok() {
        tracing::info!("stopped");
    }
    result
}

/// First SIGTERM or SIGINT: cancel (stop passes, keep or remove the datapath, exit 0). Second:
/// exit at once.
async fn watch_signals(shutdown: CancellationToken) {
    let mut count = 0;
    loop {
        if let Err(e) = next_signal().await {
            tracing::error!("listening for signals: {e}");
            return;
        }
        count += 1;
        if count == 1 {
            tracing::info!("signal received: shutting down (send another to exit at once)");
            shutdown.cancel();
        } else {
            tracing::warn!("second signal: exiting at once");
            std::process::exit(EXIT_SECOND_SIGNAL);
        }
    }
}

#[cfg(unix)]
async fn next_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

#[cfg(not(unix))]
async fn next_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}

/// The stop policy the flags give: decide by the owning DaemonSet inside a Pod, keep otherwise.
pub fn stop_policy(pod: Option<String>, namespace: Option<String>) -> StopPolicy {
    match (pod, namespace) {
        (Some(pod), Some(namespace)) => StopPolicy::Owner { pod, namespace },
        _ => StopPolicy::Keep,
    }
}

/// `kuport cleanup`: removes everything kuport programmed on this host (its nftables table,
/// its `kup-*` links, its ip rules and routes), whatever the API server says.
pub fn cleanup() -> anyhow::Result<()> {
    use kuport_host::Host;
    init_logging(LogLevel::Info, LogFormat::Text);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let mut host = LinuxHost::new().context("opening the host's netlink socket")?;
        host.teardown()
            .await
            .context("removing kuport's datapath from this host")
    })?;
    eprintln!(
        "removed kuport's datapath from this host: nftables table ip kuport, kup-* links, kuport's ip rules and routes"
    );
    Ok(())
}

async fn make_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::incluster().context(
            "loading the in-cluster configuration (outside a cluster, pass --kubeconfig)",
        )?,
    };
    crate::kube_client(config).context("building the Kubernetes client")
}

fn init_logging(level: LogLevel, format: LogFormat) {
    let level = match level {
        LogLevel::Error => tracing::Level::ERROR,
        LogLevel::Warn => tracing::Level::WARN,
        LogLevel::Info => tracing::Level::INFO,
        LogLevel::Debug => tracing::Level::DEBUG,
        LogLevel::Trace => tracing::Level::TRACE,
    };
    // Colours only on a terminal: `kubectl logs` and log shippers read the escape codes as
    // text, which breaks grep and the documented line format.
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    // A second initialisation (only possible when embedding) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// The mark layout of the flags, refused when it overlaps another datapath's bits (unless
/// allowed) or is not one contiguous run.
fn checked_marks(args: &AgentArgs) -> anyhow::Result<MarkLayout> {
    let marks = MarkLayout {
        base: args.mark_base,
        mask: args.mark_mask,
    };
    let checked = if args.allow_mark_overlap {
        marks.validate_shape()
    } else {
        marks.validate()
    };
    checked.map_err(|e| anyhow::anyhow!("--mark-base/--mark-mask: {e}"))?;
    Ok(marks)
}

/// The agent with its return links probed every `interval` (`0s`: not probed).
fn with_probes(agent: Agent<LinuxHost>, interval: Duration) -> Agent<LinuxHost> {
    if interval.is_zero() {
        return agent;
    }
    agent.with_link_probes(LinkProber::new(ProbeSettings {
        interval,
        ..ProbeSettings::default()
    }))
}

/// A duration as [`parse_duration`] reads it, or zero (`0s`, `0ms`, `0`): "off".
fn parse_duration_or_off(text: &str) -> Result<Duration, String> {
    let digits = text
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if !digits.is_empty() && digits.chars().all(|c| c == '0') {
        return Ok(Duration::ZERO);
    }
    parse_duration(text)
}

/// Parses `10s`, `5m`, `1h`, `250ms` (a whole number and a unit; zero is refused).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let digits = text.chars().take_while(char::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(format!(
            "{text:?} is not a duration: expected a whole number and a unit (ms, s, m, h), e.g. 5m"
        ));
    }
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: {number} is too large"))?;
    let seconds = |mult: u64| {
        n.checked_mul(mult)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{text:?} is too long"))
    };
    let duration = match unit {
        "ms" => Duration::from_millis(n),
        "s" => seconds(1)?,
        "m" => seconds(60)?,
        "h" => seconds(3600)?,
        "" => {
            return Err(format!(
                "{text:?} has no unit: use ms, s, m or h, e.g. {n}s"
            ));
        }
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?}; use ms, s, m or h"
            ));
        }
    };
    if duration.is_zero() {
        return Err(format!("{text:?} must be longer than zero"));
    }
    Ok(duration)
}

/// Parses `HOST:PORT`, or `:PORT` for every IPv4 address.
/// A listen address as given: `HOST:PORT`, or `:PORT` for the node's own address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// An explicit address.
    Exact(SocketAddr),
    /// A port on the node's own address (resolved at start).
    OwnAddress(u16),
}

impl ListenAddr {
    /// The socket address to bind, with `own` standing for the node's address.
    pub fn resolve(self, own: IpAddr) -> SocketAddr {
        match self {
            ListenAddr::Exact(addr) => addr,
            ListenAddr::OwnAddress(port) => SocketAddr::new(own, port),
        }
    }
}

/// Parses `HOST:PORT` or `:PORT`.
pub fn parse_listen_addr(text: &str) -> Result<ListenAddr, String> {
    let bad =
        || format!("{text:?} is not a listen address: expected HOST:PORT or :PORT, e.g. :9090");
    match text.strip_prefix(':') {
        Some(port) => port.parse().map(ListenAddr::OwnAddress).map_err(|_| bad()),
        None => text.parse().map(ListenAddr::Exact).map_err(|_| bad()),
    }
}

/// Parses a mark: hexadecimal with `0x`, or decimal.
pub fn parse_mark(text: &str) -> Result<u32, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| format!("{text:?} is not a mark: expected a number such as 0xff or 255"))
}

fn parse_object_name(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("the name must not be empty".to_owned());
    }
    Ok(text.to_owned())
}

fn parse_node_name(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("the node name must not be empty".to_owned());
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_interval_takes_zero_as_off_and_any_duration() {
        for off in ["0s", "0ms", "0", "00s"] {
            assert_eq!(parse_duration_or_off(off), Ok(Duration::ZERO), "{off}");
        }
        assert_eq!(parse_duration_or_off("2s"), Ok(Duration::from_secs(2)));
        for bad in ["", "s", "-1s", "2x"] {
            assert!(parse_duration_or_off(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_parse_with_units_and_refuse_the_rest() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in [
            "",
            "5",
            "m",
            "5x",
            "0s",
            "-5s",
            "1.5m",
            "99999999999999999999s",
        ] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(!err.is_empty());
        }
        assert!(
            parse_duration("5")
                .expect_err("no unit")
                .contains("no unit")
        );
    }

    #[test]
    fn the_stop_policy_asks_the_owner_only_inside_a_pod() {
        assert_eq!(stop_policy(None, None), StopPolicy::Keep);
        assert_eq!(stop_policy(Some("p".into()), None), StopPolicy::Keep);
        assert_eq!(
            stop_policy(Some("p".into()), Some("kuport-system".into())),
            StopPolicy::Owner {
                pod: "p".into(),
                namespace: "kuport-system".into()
            }
        );
    }

    #[test]
    fn a_bare_port_listens_on_the_node_address_never_on_every_address() {
        let own: IpAddr = "100.64.0.1".parse().expect("ip");
        let bare = parse_listen_addr(":8081").expect("bare port");
        assert_eq!(bare, ListenAddr::OwnAddress(8081));
        assert_eq!(bare.resolve(own), "100.64.0.1:8081".parse().expect("addr"));
        let exact = parse_listen_addr("127.0.0.1:9090").expect("exact");
        assert_eq!(exact.resolve(own), "127.0.0.1:9090".parse().expect("addr"));
        let every = parse_listen_addr("0.0.0.0:9090").expect("explicit");
        assert_eq!(every.resolve(own), "0.0.0.0:9090".parse().expect("addr"));
        assert!(parse_listen_addr("9090").is_err());
        assert!(parse_listen_addr(":http").is_err());
    }

    #[test]
    fn marks_parse_in_hex_or_decimal() {
        assert_eq!(parse_mark("0xff"), Ok(255));
        assert_eq!(parse_mark("255"), Ok(255));
        assert!(parse_mark("0xzz").is_err());
        assert!(parse_mark("").is_err());
    }
}
