//! The end-to-end driver's command sequence, checked without a cluster: the dry-run shell
//! records every command, answering as a healthy run would, and a shell that answers like a
//! broken cluster makes the run fail with the reason.

use std::path::{Path, PathBuf};

use anyhow::Result;
use kuport_e2e::driver::{
    self, Cmd, DRAIN_ASKS, DryRun, LOOP_ASKS, Options, Shell, healthy_output,
};

fn options() -> Options {
    Options {
        repo: Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
        cluster: "kt".into(),
        image: "kuport-agent:e2e".into(),
        image_archive: None,
        keep: false,
    }
}

/// Each command as `program first-args...`, cut before the first argument that carries data
/// (paths, scripts), so the expected sequence reads like the run.
fn outline(c: &Cmd) -> String {
    let mut words = vec![c.program.clone()];
    for a in &c.args {
        let resource = ["daemonset/", "deployment/", "portmap/", "docker.io/"]
            .iter()
            .any(|p| a.starts_with(p));
        if (a.contains('/') && !resource) || a.contains(' ') || a.starts_with("jsonpath=") {
            break;
        }
        words.push(a.clone());
    }
    words.join(" ")
}

#[test]
fn the_dry_run_prints_the_whole_sequence_in_order() {
    let mut shell = DryRun::default();
    let summary = driver::run(&mut shell, &options()).expect("a healthy dry run passes");
    assert_eq!(summary.probes, vec!["172.18.0.9"; 3]);
    assert_eq!(
        (summary.drain_sent, summary.drain_answered),
        (DRAIN_ASKS, DRAIN_ASKS)
    );
    assert_eq!(
        (summary.loop_sent, summary.loop_answered),
        (LOOP_ASKS, LOOP_ASKS)
    );
    let got: Vec<String> = shell.commands.iter().map(outline).collect();
    let k = "kubectl --context kind-kt";
    let expected = vec![
        "kind create cluster --name kt --config - --wait 180s".to_owned(),
        "docker build --tag kuport-agent:e2e".to_owned(),
        "kind load docker-image kuport-agent:e2e --name kt".to_owned(),
        format!("{k} apply --server-side -f"),
        format!("{k} apply -f -"),
        format!("{k} -n kuport-system rollout status daemonset/kuport-agent --timeout=180s"),
        format!("{k} -n kuport-system get events --field-selector reason=Unhealthy -o name"),
        format!("{k} get node kt-worker -o"),
        format!("{k} cordon kt-control-plane"),
        format!("{k} apply -f -"),
        format!("{k} -n kuport-e2e rollout status deployment/echo --timeout=180s"),
        format!("{k} uncordon kt-control-plane"),
        format!("{k} -n kuport-e2e wait portmap/echo --for=jsonpath={{.status.endpoint.node}}=kt-worker2 --timeout=180s"),
        format!("{k} -n kuport-e2e wait portmap/echo --for=condition=Programmed --timeout=180s"),
        "docker run --rm --network kind --entrypoint sh docker.io/alpine/socat:1.8.0.3 -c".to_owned(),
        // The readiness probe made to fail, the refusal, ready again.
        format!("{k} -n kuport-e2e exec deployment/echo -c echo -- sh -c"),
        format!("{k} -n kuport-e2e get portmap/echo -o"),
        "docker run --rm --network kind --entrypoint sh docker.io/alpine/socat:1.8.0.3 -c".to_owned(),
        format!("{k} -n kuport-e2e exec deployment/echo -c echo -- sh -c"),
        format!("{k} -n kuport-e2e get portmap/echo -o"),
        "docker run --rm --network kind --entrypoint sh docker.io/alpine/socat:1.8.0.3 -c".to_owned(),
        // The accepting node drained under a probe loop.
        "docker run --detach --name kt-prober-200 --network kind --entrypoint sh docker.io/alpine/socat:1.8.0.3 -c".to_owned(),
        format!("{k} drain kt-worker --ignore-daemonsets --delete-emptydir-data --timeout=120s"),
        "docker wait kt-prober-200".to_owned(),
        "docker logs kt-prober-200".to_owned(),
        "docker rm kt-prober-200".to_owned(),
        format!("{k} uncordon kt-worker"),
        // The scheduler moves the pod.
        format!("{k} cordon kt-worker2"),
        format!("{k} -n kuport-e2e delete pod -l app=echo --wait=true"),
        format!("{k} -n kuport-e2e rollout status deployment/echo --timeout=180s"),
        format!("{k} uncordon kt-worker2"),
        format!("{k} -n kuport-e2e wait portmap/echo --for=jsonpath={{.status.endpoint.node}}=kt-control-plane --timeout=180s"),
        format!("{k} -n kuport-e2e wait portmap/echo --for=condition=Programmed --timeout=180s"),
        "docker run --rm --network kind --entrypoint sh docker.io/alpine/socat:1.8.0.3 -c".to_owned(),
        "docker run --detach --name kt-prober-900 --network kind --entrypoint sh docker.io/alpine/socat:1.8.0.3 -c".to_owned(),
        format!("{k} -n kuport-system rollout restart daemonset/kuport-agent"),
        format!("{k} -n kuport-system rollout status daemonset/kuport-agent --timeout=300s"),
        "docker wait kt-prober-900".to_owned(),
        "docker logs kt-prober-900".to_owned(),
        "docker rm kt-prober-900".to_owned(),
        format!("{k} delete --wait=true -f -"),
        "docker run --rm --network container:kt-control-plane --cap-add NET_ADMIN --entrypoint nft kuport-agent:e2e list tables".to_owned(),
        "docker exec kt-control-plane ip -o link show".to_owned(),
        "docker run --rm --network container:kt-worker --cap-add NET_ADMIN --entrypoint nft kuport-agent:e2e list tables".to_owned(),
        "docker exec kt-worker ip -o link show".to_owned(),
        "docker run --rm --network container:kt-worker2 --cap-add NET_ADMIN --entrypoint nft kuport-agent:e2e list tables".to_owned(),
        "docker exec kt-worker2 ip -o link show".to_owned(),
        "kind delete cluster --name kt".to_owned(),
    ];
    assert_eq!(got, expected);

    // What goes in on standard input: the kind config with two workers, the manifests with
    // the image under test (installed and later deleted the same way), the workload.
    let stdin: Vec<&str> = shell
        .commands
        .iter()
        .filter_map(|c| c.stdin.as_deref())
        .collect();
    assert_eq!(stdin.len(), 4);
    assert_eq!(stdin[0].matches("role: worker").count(), 2);
    assert!(stdin[1].contains("image: kuport-agent:e2e"));
    assert!(
        !stdin[1].contains("ghcr.io"),
        "the image under test replaces the default one"
    );
    assert_eq!(stdin[1], stdin[3], "uninstall deletes what was installed");
    assert!(stdin[2].contains("kt-worker: {interfaces: [eth0]}"));
    assert!(stdin[2].contains("values: [kt-worker2, kt-control-plane]"));
    // The CRDs come from the repository's crds/.
    assert!(
        shell.commands[3]
            .args
            .last()
            .is_some_and(|a| a.ends_with("/crds"))
    );
}

#[test]
fn an_image_archive_is_loaded_instead_of_built_and_keep_leaves_the_cluster() {
    let mut shell = DryRun::default();
    let o = Options {
        image_archive: Some(PathBuf::from("/tmp/kuport.tar")),
        keep: true,
        ..options()
    };
    driver::run(&mut shell, &o).expect("dry run");
    assert_eq!(
        shell.commands[1].to_string(),
        "docker load --input /tmp/kuport.tar"
    );
    assert!(
        shell
            .commands
            .iter()
            .all(|c| c.program != "docker" || c.args[0] != "build")
    );
    assert!(
        shell.commands.last().is_some_and(|c| c.args[0] != "delete"),
        "--keep leaves the cluster"
    );
}

/// A shell answering like a healthy cluster except where `broken` says.
struct Broken<F: FnMut(&Cmd) -> Option<String>> {
    commands: Vec<Cmd>,
    broken: F,
}

impl<F: FnMut(&Cmd) -> Option<String>> Shell for Broken<F> {
    fn run(&mut self, cmd: &Cmd) -> Result<String> {
        self.commands.push(cmd.clone());
        Ok((self.broken)(cmd).unwrap_or_else(|| healthy_output(cmd)))
    }
}

fn fails_with(broken: impl FnMut(&Cmd) -> Option<String>, what: &str) -> Vec<Cmd> {
    let mut shell = Broken {
        commands: Vec::new(),
        broken,
    };
    let err = driver::run(&mut shell, &options()).expect_err(what);
    assert!(format!("{err:#}").contains(what), "{err:#}");
    let last = shell.commands.last().expect("commands ran");
    assert_eq!(
        last.to_string(),
        "kind delete cluster --name kt",
        "a failed run still deletes the cluster"
    );
    shell.commands
}

#[test]
fn a_failed_probe_at_the_agents_start_fails_the_run() {
    fails_with(
        |c| {
            c.args
                .iter()
                .any(|a| a == "reason=Unhealthy")
                .then(|| "event/kuport-agent-x.1".to_owned())
        },
        "the agents' start recorded failed probes",
    );
}

#[test]
fn a_lost_client_address_a_lost_probe_or_a_dirty_node_fails_the_run() {
    fails_with(
        |c| {
            (c.args.join(" ").contains("prober-address"))
                .then(|| "prober-address 172.18.0.9\nsaw 10.244.2.1:4000".to_owned())
        },
        "not the prober's own address",
    );
    fails_with(
        |c| {
            (c.args.first().is_some_and(|a| a == "logs"))
                .then(|| format!("sent {LOOP_ASKS} answered {}", LOOP_ASKS - 3))
        },
        "lost 3 of 900 probes",
    );
    let commands = fails_with(
        |c| {
            (c.args.first().is_some_and(|a| a == "exec") && c.args[1] == "kt-worker")
                .then(|| "9: kup-0badc0de@eth0: <BROADCAST>".to_owned())
        },
        "node kt-worker is not clean after uninstall: link kup-0badc0de",
    );
    assert!(
        commands
            .iter()
            .any(|c| c.args.first().is_some_and(|a| a == "logs"))
    );
}

#[test]
fn an_answer_from_an_unready_pod_or_a_drain_that_loses_probes_fails_the_run() {
    fails_with(
        |c| {
            (c.args.join(" ").contains("refusal-check"))
                .then(|| "refusal-check\nsaw 172.18.0.9:4000".to_owned())
        },
        "the mapping answered with its only pod unready",
    );
    fails_with(
        |c| {
            (c.args.first().is_some_and(|a| a == "logs")
                && c.args.last().is_some_and(|a| a.ends_with("-200")))
            .then(|| "sent 200 answered 190".to_owned())
        },
        "the drain lost 10 of 200 probes",
    );
}
