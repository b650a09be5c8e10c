//! Files replaced whole.

use std::io::Write as _;
use std::path::Path;

/// Writes `contents` to `path` through a temporary file in the same directory and a rename, so
/// a reader (or a process interrupted half-way) sees the old file or the new one, never a
/// truncated one.
pub fn write_atomically(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut tmp = tempfile::NamedTempFile::new_in(directory_of(path))?;
    tmp.write_all(contents.as_bytes())?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The directory `path` is in. A bare file name's parent is the empty path, in which no file
/// can be created: its directory is the current one.
fn directory_of(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{directory_of, write_atomically};

    /// Moved from `kuport-sim`'s binary with the function.
    #[test]
    fn kubeconfig_replaces_the_old_file_whole_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, "old").unwrap();
        write_atomically(&path, "new contents").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new contents");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["kubeconfig"]);
    }

    #[test]
    fn a_bare_file_name_is_in_the_current_directory() {
        assert_eq!(directory_of(Path::new("kubeconfig")), Path::new("."));
        assert_eq!(directory_of(Path::new("a/kubeconfig")), Path::new("a"));
        assert_eq!(directory_of(Path::new("/kubeconfig")), Path::new("/"));
    }
}
