//! `kuport plan`, run as a binary on the objects in testdata/plan: the JSON contract, the other
//! outputs, the input forms, and exit status 2 naming the file for every unreadable input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const NOW: &str = "2026-01-01T00:00:00Z";

fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/plan")
        .join(rel)
}

fn kuport(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kuport"))
        .args(args)
        .output()
        .expect("running kuport")
}

/// `kuport plan --objects <rel>... --node <node> --now NOW` plus `extra`.
fn plan(objects: &[&str], node: &str, extra: &[&str]) -> Output {
    let paths: Vec<String> = objects
        .iter()
        .map(|o| testdata(o).display().to_string())
        .collect();
    let mut args = vec!["plan"];
    for path in &paths {
        args.extend(["--objects", path.as_str()]);
    }
    args.extend(["--node", node, "--now", NOW]);
    args.extend(extra);
    kuport(&args)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn succeeded(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "kuport failed; stderr:\n{}",
        stderr(out)
    );
    stdout(out)
}

fn json(out: &Output) -> Value {
    let text = succeeded(out);
    assert!(text.ends_with("}\n"), "JSON output ends with a newline");
    serde_json::from_str(&text).expect("kuport plan prints JSON")
}

fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

/// The plan for worker-1 of the seed objects.
fn seed_plan() -> Value {
    json(&plan(&["objects"], "worker-1", &["--output", "json"]))
}

/// The seed objects as worker-1 sees them with its host facts (without them no interface has an
/// address, and only packets addressed to an interface's own address are captured).
fn seed_plan_with_facts() -> Value {
    let facts = testdata("facts-worker-1.yaml").display().to_string();
    json(&plan(
        &["objects"],
        "worker-1",
        &["--output", "json", "--facts", &facts],
    ))
}

#[test]
fn seed_json_follows_the_contract() {
    let report = seed_plan_with_facts();
    assert_eq!(
        keys(&report),
        ["classes", "host", "node", "portmaps", "writes"]
    );
    assert_eq!(report["node"], "worker-1");

    let portmaps = report["portmaps"].as_array().expect("portmaps is an array");
    assert_eq!(portmaps.len(), 1);
    let pm = &portmaps[0];
    assert_eq!(
        keys(pm),
        [
            "accepted",
            "endpoint",
            "links",
            "name",
            "namespace",
            "programmed",
            "programmingNodes",
            "published",
            "servingNode",
            "standbyLinks",
            "statusWriter"
        ]
    );
    for array in ["programmingNodes", "published", "links", "standbyLinks"] {
        assert!(pm[array].is_array(), "{array} is an array: {}", pm[array]);
    }
    assert_eq!(pm["namespace"], "games");
    assert_eq!(pm["name"], "gameserver");
    assert_eq!(pm["accepted"]["status"], "True");
    assert_eq!(keys(&pm["accepted"]), ["message", "reason", "status"]);
    assert_eq!(pm["endpoint"]["node"], "worker-1");
    assert_eq!(pm["endpoint"]["address"], "10.244.1.5");
    assert_eq!(pm["endpoint"]["port"], 3000);
    assert_eq!(pm["servingNode"], "worker-1");

    let writes = &report["writes"];
    assert_eq!(keys(writes), ["claims", "classRows", "gc", "portmaps"]);
    let written: Vec<&str> = writes["portmaps"]
        .as_array()
        .expect("writes.portmaps is an array")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(written.contains(&"games/gameserver"), "{written:?}");

    let classes: Vec<&str> = report["classes"]
        .as_array()
        .expect("classes is an array")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(classes, ["intranet", "public"]);

    let host = &report["host"];
    assert_eq!(keys(host), ["links", "nftables", "routes", "rules"]);
    assert!(
        host["nftables"]
            .as_str()
            .expect("nftables is a string")
            .starts_with("table ip kuport {")
    );
    for array in ["links", "rules", "routes"] {
        assert!(host[array].is_array(), "host.{array} is an array");
    }
}

#[test]
fn nft_output_is_the_table() {
    let facts = testdata("facts-worker-1.yaml").display().to_string();
    let out = succeeded(&plan(
        &["objects"],
        "worker-1",
        &["--output", "nft", "--facts", &facts],
    ));
    assert!(out.starts_with("table ip kuport {"), "{out}");
    // The mapping is an element of the DNAT map: its key, and the pod it goes to.
    assert!(
        out.contains("\"wt0\" . udp . 3000-3009 : 10.244.1.5"),
        "{out}"
    );
    // Clients inside the cluster: the published address in the hairpin set and its DNAT map,
    // and the output hook for the node's own processes.
    assert!(
        out.contains("100.64.0.1 . udp . 3000-3009 : 10.244.1.5"),
        "{out}"
    );
    assert!(out.contains("chain kup-out {"), "{out}");
    assert!(out.contains("set hairpin-sources {"), "{out}");
    // The same text as the JSON report carries.
    assert_eq!(seed_plan_with_facts()["host"]["nftables"], out.as_str());
}

#[test]
fn text_output_names_the_mapping() {
    let out = succeeded(&plan(&["objects"], "worker-1", &["--output", "text"]));
    assert!(out.contains("games/gameserver"), "{out}");
    assert!(out.starts_with("plan for node worker-1\n"), "{out}");
}

#[test]
fn json_is_the_default_output() {
    assert_eq!(json(&plan(&["objects"], "worker-1", &[])), seed_plan());
}

#[test]
fn every_input_form_gives_the_same_plan() {
    let from_dir = seed_plan();
    for form in [
        &["flat.yaml"][..],
        &["list.yaml"],
        &["list.json"],
        &[
            "objects/cluster",
            "objects/gameserver-portmap.yaml",
            "objects/intranet-class.yaml",
            "objects/public-class.yaml",
        ],
        // The same file named twice is read once.
        &["objects", "objects/gameserver-portmap.yaml"],
    ] {
        assert_eq!(
            json(&plan(form, "worker-1", &[])),
            from_dir,
            "input {form:?}"
        );
    }
}

#[test]
fn objects_takes_several_values_after_one_flag() {
    let cluster = testdata("objects/cluster").display().to_string();
    let rest: Vec<String> = [
        "gameserver-portmap.yaml",
        "intranet-class.yaml",
        "public-class.yaml",
    ]
    .iter()
    .map(|f| testdata(&format!("objects/{f}")).display().to_string())
    .collect();
    let mut args = vec!["plan", "--objects", cluster.as_str()];
    args.extend(rest.iter().map(String::as_str));
    args.extend(["--node", "worker-1", "--now", NOW]);
    assert_eq!(json(&kuport(&args)), seed_plan());
}

/// Runs `kuport plan` expecting exit status 2 with a message naming `name`.
fn rejected(out: &Output, name: &str) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "exit status; stderr:\n{err}");
    assert!(err.contains(name), "stderr names {name}:\n{err}");
    assert!(!err.contains("panicked"), "no panic:\n{err}");
    assert!(out.stdout.is_empty(), "nothing on stdout");
    err
}

#[test]
fn a_missing_path_is_rejected() {
    let err = rejected(
        &plan(&["objects", "no-such-dir"], "worker-1", &[]),
        "no-such-dir",
    );
    assert!(err.contains("no such file"), "{err}");
}

#[test]
fn invalid_yaml_is_rejected() {
    let err = rejected(
        &plan(&["bad/invalid.yaml"], "worker-1", &[]),
        "bad/invalid.yaml",
    );
    assert!(err.contains("not valid YAML"), "{err}");
    assert!(err.contains("line 4"), "{err}");
}

#[test]
fn invalid_json_is_rejected() {
    let dir = scratch_dir("invalid-json");
    let file = dir.join("objects.json");
    std::fs::write(&file, "{\"apiVersion\": \"v1\",").expect("writing the test file");
    let path = file.display().to_string();
    let out = kuport(&["plan", "--objects", &path, "--node", "worker-1"]);
    let err = rejected(&out, &path);
    assert!(err.contains("not valid JSON"), "{err}");
}

#[test]
fn a_portmap_that_does_not_fit_its_type_is_rejected() {
    let err = rejected(
        &plan(&["bad/port-not-a-number.yaml"], "worker-1", &[]),
        "bad/port-not-a-number.yaml",
    );
    assert!(
        err.contains("document 2 (PortMap games/gameserver)"),
        "{err}"
    );
    assert!(
        err.contains("spec.port: invalid type: string \"abc\""),
        "{err}"
    );
}

#[test]
fn a_document_that_is_not_an_object_is_rejected() {
    let dir = scratch_dir("scalar");
    let file = dir.join("objects.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\nhello\n",
    )
    .expect("writing the test file");
    let path = file.display().to_string();
    let out = kuport(&["plan", "--objects", &path, "--node", "worker-1"]);
    let err = rejected(&out, &path);
    assert!(err.contains("document 2"), "{err}");
}

#[test]
fn invalid_facts_are_rejected() {
    let err = rejected(
        &plan(
            &["objects"],
            "worker-1",
            &[
                "--facts",
                &testdata("bad/facts-misspelt.yaml").display().to_string(),
            ],
        ),
        "bad/facts-misspelt.yaml",
    );
    assert!(err.contains("underlayMtu"), "{err}");

    let err = rejected(
        &plan(
            &["objects"],
            "worker-1",
            &[
                "--facts",
                &testdata("bad/facts-bad-address.yaml").display().to_string(),
            ],
        ),
        "bad/facts-bad-address.yaml",
    );
    assert!(err.contains("interfaces.enp1s0"), "{err}");

    let missing = testdata("no-such-facts.yaml").display().to_string();
    rejected(
        &plan(&["objects"], "worker-1", &["--facts", &missing]),
        "no-such-facts.yaml",
    );
}

#[test]
fn an_invalid_now_is_rejected() {
    let objects = testdata("objects").display().to_string();
    let out = kuport(&[
        "plan",
        "--objects",
        &objects,
        "--node",
        "worker-1",
        "--now",
        "yesterday",
    ]);
    let err = rejected(&out, "yesterday");
    assert!(err.contains("--now"), "{err}");
}

#[test]
fn an_unknown_node_warns_and_programs_nothing() {
    let out = plan(&["objects"], "edge-9", &[]);
    let report = json(&out);
    assert!(
        stderr(&out).contains("warning: node edge-9 has no Node object; it programs nothing"),
        "{}",
        stderr(&out)
    );
    assert_eq!(report["node"], "edge-9");
    assert_eq!(report["host"]["nftables"], "");
    assert_eq!(report["writes"]["portmaps"], serde_json::json!([]));
}

#[test]
fn a_known_node_does_not_warn() {
    let facts = testdata("facts-worker-1.yaml").display().to_string();
    let out = plan(&["objects"], "worker-1", &["--facts", &facts]);
    succeeded(&out);
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}

#[test]
fn an_accepting_node_without_facts_is_warned_that_nothing_is_captured() {
    let out = plan(&["objects"], "worker-1", &[]);
    succeeded(&out);
    let err = stderr(&out);
    assert!(
        err.contains("warning: no --facts: the addresses of node worker-1's interfaces (")
            && err.contains("capture nothing there"),
        "{err}"
    );
    assert!(
        err.contains("(enp1s0, wt0)") && err.contains("(classes intranet, public)"),
        "{err}"
    );
    let err = stderr(&plan(&["objects"], "worker-2", &[]));
    assert!(
        err.contains("(wt0)") && err.contains("(classes intranet)"),
        "{err}"
    );
    // A node no class names captures nothing anyway: no such warning.
    let out = plan(&["objects"], "edge-9", &[]);
    assert!(!stderr(&out).contains("--facts"), "{}", stderr(&out));
}

#[test]
fn facts_fill_the_published_addresses_of_this_node() {
    let without = seed_plan();
    let published = |report: &Value| -> Vec<(String, String)> {
        report["portmaps"][0]["published"]
            .as_array()
            .expect("published is an array")
            .iter()
            .filter(|p| p["node"] == "worker-1")
            .map(|p| {
                (
                    p["interface"].as_str().unwrap_or_default().to_owned(),
                    p["address"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(i, a)| ((*i).to_owned(), (*a).to_owned()))
            .collect()
    };
    assert_eq!(published(&without), pairs(&[("enp1s0", ""), ("wt0", "")]));
    for facts in ["facts-worker-1.yaml", "facts-worker-1.json"] {
        let facts = testdata(facts).display().to_string();
        let with = json(&plan(&["objects"], "worker-1", &["--facts", &facts]));
        assert_eq!(
            published(&with),
            pairs(&[("enp1s0", "203.0.113.9"), ("wt0", "100.64.0.1")]),
            "{facts}"
        );
    }
}

#[test]
fn long_streams_are_read() {
    // More documents and nodes than the YAML parser's default limits allow.
    let dir = scratch_dir("long");
    let file = dir.join("namespaces.yaml");
    let mut text = String::new();
    for i in 0..3000 {
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns{i}\n  labels:\n"
        ));
        for j in 0..30 {
            text.push_str(&format!("    label-{j}: value\n"));
        }
    }
    std::fs::write(&file, text).expect("writing the test file");
    let objects = testdata("objects").display().to_string();
    let path = file.display().to_string();
    let out = kuport(&[
        "plan",
        "--objects",
        &objects,
        &path,
        "--node",
        "worker-1",
        "--now",
        NOW,
    ]);
    assert_eq!(json(&out), seed_plan());
}

#[test]
fn help_documents_every_flag() {
    let out = kuport(&["plan", "--help"]);
    let help = succeeded(&out);
    for flag in ["--objects", "--node", "--facts", "--now", "--output"] {
        assert!(help.contains(flag), "help mentions {flag}:\n{help}");
    }
    for value in ["json", "nft", "text", "RFC 3339", "underlayMTU"] {
        assert!(help.contains(value), "help mentions {value}:\n{help}");
    }
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kuport-plan-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a scratch directory");
    dir
}

/// A dual-stack copy of the seed: worker-1 lists an IPv6 pod CIDR, the Service an IPv6
/// EndpointSlice for the same pod, and worker-1's enp1s0 an IPv6 address in its facts. The
/// contract's IPv6 additions appear (`nftables6`, the published and endpoint `ipv6Address`)
/// and its IPv4 fields keep their meaning; the IPv4-only seed carries none of them.
#[test]
fn a_dual_stack_input_adds_the_ipv6_fields_and_keeps_the_contract() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let objects = dir.path().join("objects");
    std::fs::create_dir_all(objects.join("cluster")).expect("objects dir");
    for rel in [
        "gameserver-portmap.yaml",
        "intranet-class.yaml",
        "public-class.yaml",
        "cluster/cilium-config.yaml",
        "cluster/gameserver.yaml",
        "cluster/namespaces.yaml",
    ] {
        std::fs::copy(testdata(&format!("objects/{rel}")), objects.join(rel)).expect("copy");
    }
    let nodes = std::fs::read_to_string(testdata("objects/cluster/nodes.yaml")).expect("nodes");
    let dual_nodes = nodes.replacen(
        "  podCIDR: 10.244.1.0/24\n",
        "  podCIDR: 10.244.1.0/24\n  podCIDRs: [10.244.1.0/24, \"fd00:10:244:1::/64\"]\n",
        1,
    );
    assert_ne!(
        nodes, dual_nodes,
        "worker-1's podCIDR is where the test expects it"
    );
    std::fs::write(objects.join("cluster/nodes.yaml"), dual_nodes).expect("nodes");
    std::fs::write(
        objects.join("cluster/gameserver-ipv6.yaml"),
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: gameserver-v6\n  namespace: games\n  labels: {kubernetes.io/service-name: gameserver}\naddressType: IPv6\nports: [{name: game, protocol: UDP, port: 3000}]\nendpoints:\n  - addresses: [\"fd00:10:244:1::5\"]\n    conditions: {ready: true, serving: true, terminating: false}\n    nodeName: worker-1\n    targetRef: {kind: Pod, name: gameserver-0, namespace: games}\n",
    )
    .expect("slice");
    let facts = dir.path().join("facts.yaml");
    std::fs::write(
        &facts,
        "interfaces: {enp1s0: 203.0.113.9, wt0: 100.64.0.1}\ninterfaces6: {enp1s0: \"2001:db8:203::9\"}\nunderlayDevice: wt0\nunderlayMTU: 1420\n",
    )
    .expect("facts");
    let out = kuport(&[
        "plan",
        "--objects",
        &objects.display().to_string(),
        "--node",
        "worker-1",
        "--now",
        NOW,
        "--facts",
        &facts.display().to_string(),
    ]);
    let report = json(&out);
    let seed = seed_plan_with_facts();
    // The same top-level and host keys as the seed, plus the IPv6 table.
    assert_eq!(keys(&report), keys(&seed));
    let mut host_keys = keys(&seed["host"]);
    host_keys.push("nftables6");
    host_keys.sort_unstable();
    assert_eq!(keys(&report["host"]), host_keys);
    let nft6 = report["host"]["nftables6"].as_str().expect("nftables6");
    assert!(nft6.starts_with("table ip6 kuport"), "{nft6}");
    assert!(nft6.contains("fd00:10:244:1::5"), "{nft6}");
    assert!(
        !seed["host"]
            .as_object()
            .expect("host")
            .contains_key("nftables6")
    );
    let pm = &report["portmaps"][0];
    assert_eq!(pm["endpoint"]["address"], "10.244.1.5");
    assert_eq!(pm["endpoint"]["ipv6Address"], "fd00:10:244:1::5");
    let enp1s0 = pm["published"]
        .as_array()
        .expect("published")
        .iter()
        .find(|p| p["node"] == "worker-1" && p["interface"] == "enp1s0")
        .expect("enp1s0 published");
    assert_eq!(enp1s0["address"], "203.0.113.9");
    assert_eq!(enp1s0["ipv6Address"], "2001:db8:203::9");
}
