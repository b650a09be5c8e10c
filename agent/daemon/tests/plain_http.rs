//! A plain-HTTP API endpoint works with no system certificate authorities at all, as in the
//! agent's image (which carries none): `kuport status` against the API server model with the
//! system roots pointed at nothing.

use kuport_sim::apiserver::ApiServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_server_needs_no_system_certificates() {
    let server = ApiServer::builder().build().expect("model builds");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(server.serve(listener));
    let dir = std::env::temp_dir().join(format!("kuport-plain-http-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: lab, cluster: {{server: \"{url}\"}}}}]\n\
             users: [{{name: admin, user: {{token: lab}}}}]\n\
             contexts: [{{name: lab, context: {{cluster: lab, user: admin}}}}]\ncurrent-context: lab\n"
        ),
    )
    .expect("kubeconfig");
    let empty = dir.join("no-certificates");
    std::fs::create_dir_all(&empty).expect("empty dir");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_kuport"))
            .arg("status")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            // rustls-native-certs reads only these when they are set.
            .env("SSL_CERT_FILE", empty.join("none.pem"))
            .env("SSL_CERT_DIR", &empty)
            .output()
            .expect("kuport runs")
    })
    .await
    .expect("join");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The cluster was read (exit 4 is "cannot read the cluster"); the empty model has no
    // kuport DaemonSet, which the report rightly names (exit 1).
    assert!(
        matches!(out.status.code(), Some(0 | 1)) && stdout.contains("PortMaps: 0/0 programmed"),
        "exit {:?}\nstdout: {stdout}\nstderr: {stderr}",
        out.status.code(),
    );
    assert!(!stderr.contains("certificate"), "{stderr}");
}
