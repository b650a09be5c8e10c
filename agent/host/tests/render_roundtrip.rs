//! The renderer's golden files are what the kernel lists: each is loaded into nft in a throwaway
//! network namespace and listed back byte for byte. Root only: skips with one line otherwise, and
//! fails instead of skipping when KUPORT_REQUIRE_ROOT_TESTS=1.

use std::path::PathBuf;
use std::process::Command;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// Returns false (after printing why) when the test must skip.
fn root_or_skip(test: &str) -> bool {
    let have_tools = ["nft", "ip"].iter().all(|t| Command::new(t).arg("--version").output().is_ok());
    if is_root() && have_tools {
        return true;
    }
    let why = if is_root() { "nft or ip missing" } else { "not root" };
    assert!(
        std::env::var("KUPORT_REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
        "{test}: KUPORT_REQUIRE_ROOT_TESTS=1 but {why}"
    );
    eprintln!("skipping {test}: {why}");
    false
}

/// A network namespace deleted when dropped, even if the test fails.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Self {
        let name = format!("kup-t-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        let ok = Command::new("ip").args(["netns", "add", &name]).status().expect("run ip").success();
        assert!(ok, "ip netns add {name}");
        Netns(name)
    }

    fn nft(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip").args(["netns", "exec", &self.0, "nft"]).args(args).output().expect("run nft")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn golden_renderings_list_back_identically() {
    if !root_or_skip("golden_renderings_list_back_identically") {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../core/testdata/golden");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("golden dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "nft"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "expected the plan's golden cases in {}", dir.display());
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read golden");
        if text.is_empty() {
            continue;
        }
        let ns = Netns::new("render");
        let load = ns.nft(&["-f", file.to_str().expect("utf-8 path")]);
        assert!(load.status.success(), "{}: nft refused it: {}", file.display(), String::from_utf8_lossy(&load.stderr));
        let list = ns.nft(&["list", "table", "ip", "kuport"]);
        assert!(list.status.success());
        assert_eq!(String::from_utf8_lossy(&list.stdout), text, "{}", file.display());
        // Chains must be attached to their hooks (a string priority in JSON would silently not be).
        let json = String::from_utf8_lossy(&ns.nft(&["-j", "list", "chains", "ip"]).stdout).into_owned();
        assert_eq!(json.matches("\"hook\"").count(), 4, "{}: {json}", file.display());
    }
}
