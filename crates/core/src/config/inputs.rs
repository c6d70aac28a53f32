//! `[[inputs]]`: the user's files and directories copied into each sandbox at its start, under
//! `/data` (a tmpfs of `inputs_size`). Only what is declared here is ever read on the host; the
//! model's code cannot name another host path. The copy itself is `crate::sandbox::inputs`.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where every input lives in the sandbox: one tmpfs, capped by `inputs_size`.
pub const ROOT: &str = "/data";

/// One declared input: a host file or directory and where the sandbox sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InputEntry {
    /// The host file or directory; `~/` is the user's home.
    pub host: String,
    /// Its path in the sandbox, under `/data` (default: `/data/<host's last name>`).
    #[serde(default)]
    pub path: Option<String>,
}

impl InputEntry {
    /// The host path with `~` expanded.
    pub fn host_path(&self) -> PathBuf {
        match self
            .host
            .strip_prefix("~/")
            .or_else(|| (self.host == "~").then_some(""))
        {
            Some(rest) => std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default()
                .join(rest),
            None => PathBuf::from(&self.host),
        }
    }

    /// The sandbox path: as declared, or `/data/<last component of host>`.
    pub fn sandbox_path(&self) -> String {
        match &self.path {
            Some(p) => p.trim_end_matches('/').to_string(),
            None => {
                let host = self.host_path();
                let name = host
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                format!("{ROOT}/{name}")
            }
        }
    }

    /// The sandbox path relative to [`ROOT`] (`sales/2025`), once checked.
    pub fn relative(&self) -> String {
        self.sandbox_path()[ROOT.len()..]
            .trim_start_matches('/')
            .to_string()
    }
}

/// Each input's host path absolute (after `~`), its sandbox path a plain path under `/data`, and
/// no two of them the same or one inside another (a copy would silently cover the other).
pub fn check(inputs: &[InputEntry]) -> Result<(), (&'static str, String)> {
    let mut seen: Vec<String> = Vec::new();
    for i in inputs {
        if i.host.trim().is_empty() {
            return Err(("inputs", "an input has an empty host path".into()));
        }
        if !i.host_path().is_absolute() {
            return Err((
                "inputs",
                format!(
                    "host {:?} is not an absolute path (nor starts with ~/): an input must not depend on where the bridge was started",
                    i.host
                ),
            ));
        }
        let path = i.sandbox_path();
        let rel = Path::new(&path).strip_prefix(ROOT).ok();
        let plain = rel.is_some_and(|r| {
            r.components().count() > 0 && r.components().all(|c| matches!(c, Component::Normal(_)))
        });
        // `Path` drops `.` parts and doubled slashes when it reads a path: refuse them as written.
        let odd = path
            .split('/')
            .skip(1)
            .any(|part| matches!(part, "" | "." | ".."));
        if !plain || odd || path.chars().any(char::is_control) {
            return Err((
                "inputs",
                format!(
                    "path {path:?} (for host {:?}) must be a plain path under {ROOT}/, such as {ROOT}/sales, without . or .. parts",
                    i.host
                ),
            ));
        }
        for other in &seen {
            let (a, b) = (format!("{path}/"), format!("{other}/"));
            if a.starts_with(&b) || b.starts_with(&a) {
                return Err((
                    "inputs",
                    format!("paths {other:?} and {path:?} overlap: give each input its own path"),
                ));
            }
        }
        seen.push(path);
    }
    Ok(())
}

/// An input from `exec --input HOST[:PATH]`.
pub fn parse_flag(s: &str) -> InputEntry {
    match s.rsplit_once(':') {
        Some((host, path)) if path.starts_with('/') => InputEntry {
            host: host.into(),
            path: Some(path.into()),
        },
        _ => InputEntry {
            host: s.into(),
            path: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(host: &str, path: Option<&str>) -> InputEntry {
        InputEntry {
            host: host.into(),
            path: path.map(Into::into),
        }
    }

    #[test]
    fn paths_are_plain_under_data_and_never_overlap() {
        assert!(check(&[entry("/srv/sales", None)]).is_ok());
        assert_eq!(entry("/srv/sales/", None).sandbox_path(), "/data/sales");
        assert_eq!(entry("/srv/sales", Some("/data/a/b/")).relative(), "a/b");
        for bad in [
            "/data",
            "/data/",
            "/etc/x",
            "/data/../etc",
            "/data/./x",
            "data/x",
            "/datax",
        ] {
            assert!(check(&[entry("/srv/x", Some(bad))]).is_err(), "{bad}");
        }
        assert!(check(&[entry("relative/dir", None)]).is_err());
        assert!(check(&[entry("", None)]).is_err());
        let overlap = [
            entry("/a/x", Some("/data/x")),
            entry("/b/y", Some("/data/x/y")),
        ];
        assert!(check(&overlap).unwrap_err().1.contains("overlap"));
        let same_name = [entry("/a/sales", None), entry("/b/sales", None)];
        assert!(check(&same_name).is_err());
        let fine = [
            entry("/a/sales", None),
            entry("/b/sales", Some("/data/sales-b")),
        ];
        assert!(check(&fine).is_ok());
    }

    #[test]
    fn the_flag_names_a_host_path_and_maybe_where() {
        assert_eq!(parse_flag("/srv/a.csv"), entry("/srv/a.csv", None));
        assert_eq!(
            parse_flag("/srv/a:/data/b"),
            entry("/srv/a", Some("/data/b"))
        );
        // A colon in a file name is part of it unless a sandbox path follows.
        assert_eq!(parse_flag("/srv/a:b"), entry("/srv/a:b", None));
        let home = entry("~/data", None).host_path();
        assert!(home.is_absolute() && home.ends_with("data"), "{home:?}");
    }
}
