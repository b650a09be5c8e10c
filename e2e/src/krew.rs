//! The krew plugin manifest of a release (`kubectl krew install --manifest=kuport.yaml`), made
//! from the checksum files the release's CLI archives come with, so the manifest can only name
//! archives that were built and hashes that were computed.
//!
//! Each `.sha256` file holds `<hex>  kuport-v<version>-<os>-<arch>.tar.gz` as `sha256sum`
//! prints it (deploy/release/cli-archive.sh writes them). Every platform of [`PLATFORMS`] must
//! be there exactly once: a release whose matrix lost a platform fails here instead of
//! publishing a manifest that cannot install on it.

use std::collections::BTreeMap;

/// The (os, arch) pairs a release carries, as krew's selector labels spell them.
pub const PLATFORMS: [(&str, &str); 4] = [
    ("darwin", "amd64"),
    ("darwin", "arm64"),
    ("linux", "amd64"),
    ("linux", "arm64"),
];

/// One CLI archive of a release: its platform, file name and SHA-256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Archive {
    pub os: String,
    pub arch: String,
    pub file: String,
    pub sha256: String,
}

/// Why no manifest could be made; each names the file or line at fault.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KrewError {
    #[error("{source_name}: {line:?} is not `<sha256 hex>  <file>`")]
    NotAChecksumLine { source_name: String, line: String },
    #[error(
        "{source_name}: {file} is not kuport-v{version}-<os>-<arch>.tar.gz of a release platform (darwin or linux, amd64 or arm64)"
    )]
    NotAnArchive {
        source_name: String,
        file: String,
        version: String,
    },
    #[error("{file} is listed twice")]
    Duplicate { file: String },
    #[error("no archive for {os}/{arch}: every release carries darwin and linux, amd64 and arm64")]
    Missing { os: String, arch: String },
    #[error("version {0:?} is not X.Y.Z")]
    BadVersion(String),
    #[error("repository {0:?} is not OWNER/NAME")]
    BadRepository(String),
}

/// The archives named in the text of one checksum file (`source_name` is for errors).
pub fn parse_checksums(
    text: &str,
    source_name: &str,
    version: &str,
) -> Result<Vec<Archive>, KrewError> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let bad_line = || KrewError::NotAChecksumLine {
            source_name: source_name.to_owned(),
            line: line.to_owned(),
        };
        let (hex, file) = line.split_once(char::is_whitespace).ok_or_else(bad_line)?;
        // sha256sum marks a binary-mode file with `*` before its name.
        let file = file.trim_start().trim_start_matches('*');
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) || file.is_empty() {
            return Err(bad_line());
        }
        let (os, arch) = platform_of(file, version).ok_or_else(|| KrewError::NotAnArchive {
            source_name: source_name.to_owned(),
            file: file.to_owned(),
            version: version.to_owned(),
        })?;
        out.push(Archive {
            os: os.to_owned(),
            arch: arch.to_owned(),
            file: file.to_owned(),
            sha256: hex.to_ascii_lowercase(),
        });
    }
    Ok(out)
}

/// The platform of `kuport-v<version>-<os>-<arch>.tar.gz`, when it is a release platform.
fn platform_of(file: &str, version: &str) -> Option<(&'static str, &'static str)> {
    let rest = file
        .strip_prefix(&format!("kuport-v{version}-"))?
        .strip_suffix(".tar.gz")?;
    PLATFORMS
        .iter()
        .copied()
        .find(|(os, arch)| rest == format!("{os}-{arch}"))
}

fn valid_version(version: &str) -> bool {
    let parts: Vec<&str> = version.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn valid_repository(repository: &str) -> bool {
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    matches!(repository.split_once('/'), Some((owner, name)) if ok(owner) && ok(name))
}

/// The manifest for release `version` of GitHub repository `repository` (`OWNER/NAME`), whose
/// assets are `archives`. Platforms are written in [`PLATFORMS`] order, whatever order the
/// checksum files came in. The hash and version are quoted: a hash of digits only (or with
/// one `e`) would otherwise be read back as a number.
pub fn manifest(
    version: &str,
    repository: &str,
    archives: &[Archive],
) -> Result<String, KrewError> {
    if !valid_version(version) {
        return Err(KrewError::BadVersion(version.to_owned()));
    }
    if !valid_repository(repository) {
        return Err(KrewError::BadRepository(repository.to_owned()));
    }
    let mut by_platform: BTreeMap<(&str, &str), &Archive> = BTreeMap::new();
    for a in archives {
        if by_platform
            .insert((a.os.as_str(), a.arch.as_str()), a)
            .is_some()
        {
            return Err(KrewError::Duplicate {
                file: a.file.clone(),
            });
        }
    }
    let home = format!("https://github.com/{repository}");
    let mut out = format!(
        "apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: kuport
spec:
  version: \"v{version}\"
  homepage: {home}
  shortDescription: Show and check kuport's node port mappings and agents
  description: |
    kuport makes a TCP or UDP port on a node's addresses reach a pod on any node,
    with the client's own source address intact. This plugin is its CLI:
    `kubectl kuport status` shows the agents, every mapping and what is not working,
    `kubectl kuport preflight` checks the installation's preconditions,
    `kubectl kuport plan` computes an agent's plan offline, and
    `kubectl kuport version` prints the client's and the agents' versions.
  platforms:
"
    );
    for (os, arch) in PLATFORMS {
        let a = by_platform
            .get(&(os, arch))
            .ok_or_else(|| KrewError::Missing {
                os: os.to_owned(),
                arch: arch.to_owned(),
            })?;
        out.push_str(&format!(
            "  - selector:
      matchLabels:
        os: {os}
        arch: {arch}
    uri: {home}/releases/download/v{version}/{file}
    sha256: \"{sha}\"
    bin: kuport
",
            file = a.file,
            sha = a.sha256,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_checksum_line_names_a_release_archive() {
        let line = format!("{HEX}  kuport-v1.2.3-linux-arm64.tar.gz\n");
        let got = parse_checksums(&line, "x.sha256", "1.2.3").expect("parses");
        assert_eq!(got[0].os, "linux");
        assert_eq!(got[0].arch, "arm64");
        let star = format!("{HEX} *kuport-v1.2.3-darwin-amd64.tar.gz");
        assert_eq!(
            parse_checksums(&star, "x", "1.2.3").expect("binary mode")[0].file,
            "kuport-v1.2.3-darwin-amd64.tar.gz"
        );
    }

    #[test]
    fn bad_checksum_lines_are_refused_with_the_file_named() {
        for (text, want) in [
            (
                "nothex  kuport-v1.2.3-linux-amd64.tar.gz",
                "is not `<sha256",
            ),
            (HEX, "is not `<sha256"),
            (
                &format!("{HEX}  kuport-v1.2.4-linux-amd64.tar.gz") as &str,
                "release platform",
            ),
            (
                &format!("{HEX}  kuport-v1.2.3-windows-amd64.tar.gz"),
                "release platform",
            ),
        ] {
            let err = parse_checksums(text, "bad.sha256", "1.2.3").expect_err(text);
            let msg = err.to_string();
            assert!(msg.contains("bad.sha256") && msg.contains(want), "{msg}");
        }
    }

    fn all() -> Vec<Archive> {
        PLATFORMS
            .iter()
            .map(|(os, arch)| Archive {
                os: (*os).into(),
                arch: (*arch).into(),
                file: format!("kuport-v1.2.3-{os}-{arch}.tar.gz"),
                sha256: HEX.into(),
            })
            .collect()
    }

    #[test]
    fn a_missing_or_doubled_platform_or_a_bad_name_is_refused() {
        let mut three = all();
        three.remove(1);
        assert_eq!(
            manifest("1.2.3", "o/kuport", &three),
            Err(KrewError::Missing {
                os: "darwin".into(),
                arch: "arm64".into()
            })
        );
        let mut five = all();
        five.push(five[0].clone());
        assert!(matches!(
            manifest("1.2.3", "o/kuport", &five),
            Err(KrewError::Duplicate { .. })
        ));
        assert!(manifest("v1.2.3", "o/kuport", &all()).is_err());
        assert!(manifest("1.2.3", "kuport", &all()).is_err());
        assert!(manifest("1.2.3", "o/ku port", &all()).is_err());
    }

    #[test]
    fn the_platforms_are_in_a_fixed_order() {
        let mut reversed = all();
        reversed.reverse();
        assert_eq!(
            manifest("1.2.3", "o/kuport", &reversed),
            manifest("1.2.3", "o/kuport", &all())
        );
    }
}
