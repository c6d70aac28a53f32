//! Secrets of a server definition, resolved when the server starts and not before: `${VAR}`,
//! `${VAR:-default}`, `${env:VAR}`, `{env:VAR}` and `{file:/path}` references in every field
//! (`command`, `args`, `env`, `env_file`, `cwd`, `url`, `headers`), and `env_file` merged under
//! `env`. Resolving late keeps secrets out of everything that is kept or shown (discovery, the
//! `servers` report, the sandbox): they go nowhere but to the child process or the HTTP requests.
//!
//! Errors name the field and the variable or file, never a value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::discovery::ServerEntry;
use bridge_core::error::{Hint, Hinted};

/// Why a server's definition could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// A `${input:NAME}` reference: VS Code prompts for those, the bridge has no one to ask.
    #[error(
        "{what} uses the VS Code input variable ${{input:{input}}}, which the bridge cannot prompt for"
    )]
    InputVariable {
        /// The field, as `command`, `args[1]`, `env.TOKEN`, `headers.Authorization`, `url`.
        what: String,
        /// The input's name.
        input: String,
    },
    /// A `${VAR}`, `${env:VAR}` or `{env:VAR}` reference to a variable this process does not
    /// have (`${VAR:-default}` takes its default instead).
    #[error("{what} references the environment variable {var}, which is not set")]
    UnsetVariable {
        /// The field, as `command`, `args[1]`, `env.TOKEN`, `headers.Authorization`, `url`.
        what: String,
        /// The variable's name.
        var: String,
    },
    /// A `{file:/path}` reference to a file that cannot be read.
    #[error("{what} references the file {path}, which cannot be read: {source}")]
    UnreadableFile {
        /// The field, as `command`, `args[1]`, `env.TOKEN`, `headers.Authorization`, `url`.
        what: String,
        /// The path as the reference gives it.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A definition with neither `url` nor `command` (discovery skips those; one built in code
    /// may still have none).
    #[error("it has no command")]
    NoCommand,
    /// The `env_file` (its path resolved) cannot be read.
    #[error("cannot read env_file {}: {source}", path.display())]
    EnvFile {
        /// The path, its references resolved.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The `cwd` (its references resolved) does not exist or is not a directory.
    #[error("its cwd {} is not a directory", path.display())]
    CwdNotADirectory {
        /// The path, its references resolved.
        path: PathBuf,
    },
}

impl Hinted for ResolveError {
    fn hint(&self) -> Option<Hint> {
        match self {
            ResolveError::InputVariable { .. } => {
                Some(Hint::clause("put the value in env or env_file"))
            }
            _ => None,
        }
    }
}

/// A server definition with every reference resolved.
#[derive(Debug, PartialEq)]
pub(crate) enum Resolved {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// Resolve references (`${VAR}`, `${VAR:-default}`, `${env:VAR}`, `{env:VAR}`, `{file:/path}`)
/// in every field, and merge `env_file` under `env` (`env` wins).
pub(crate) fn resolve(entry: &ServerEntry) -> Result<Resolved, ResolveError> {
    if let Some(url) = &entry.url {
        let url = expand(url, "url")?;
        let mut headers = BTreeMap::new();
        for (k, v) in &entry.headers {
            headers.insert(k.clone(), expand(v, &format!("headers.{k}"))?);
        }
        return Ok(Resolved::Http { url, headers });
    }
    let command = entry.command.as_deref().ok_or(ResolveError::NoCommand)?;
    let command = expand(command, "command")?;
    let args = entry
        .args
        .iter()
        .enumerate()
        .map(|(i, a)| expand(a, &format!("args[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut env = BTreeMap::new();
    if let Some(file) = &entry.env_file {
        let file = PathBuf::from(expand(&file.to_string_lossy(), "env_file")?);
        let text = std::fs::read_to_string(&file).map_err(|source| ResolveError::EnvFile {
            path: file.clone(),
            source,
        })?;
        env.extend(parse_env_file(&text));
    }
    for (k, v) in &entry.env {
        env.insert(k.clone(), expand(v, &format!("env.{k}"))?);
    }
    let cwd = match &entry.cwd {
        Some(c) => {
            let c = PathBuf::from(expand(&c.to_string_lossy(), "cwd")?);
            if !c.is_dir() {
                return Err(ResolveError::CwdNotADirectory { path: c });
            }
            Some(c)
        }
        None => None,
    };
    Ok(Resolved::Stdio {
        command,
        args,
        env,
        cwd,
    })
}

/// Expand references in one value. `what` names the field in errors (never the value).
pub(crate) fn expand(value: &str, what: &str) -> Result<String, ResolveError> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("${")
            && let Some(end) = after.find('}')
        {
            let inner = &after[..end];
            rest = &after[end + 1..];
            if let Some(input) = inner.strip_prefix("input:") {
                return Err(ResolveError::InputVariable {
                    what: what.to_string(),
                    input: input.to_string(),
                });
            }
            let inner = inner.strip_prefix("env:").unwrap_or(inner);
            let (var, default) = match inner.split_once(":-") {
                Some((v, d)) => (v, Some(d)),
                None => (inner, None),
            };
            match (std::env::var(var), default) {
                (Ok(v), _) if !(v.is_empty() && default.is_some()) => out.push_str(&v),
                (_, Some(d)) => out.push_str(d),
                (_, None) => return Err(unset(what, var)),
            }
            continue;
        }
        if let Some(after) = rest.strip_prefix("{env:")
            && let Some(end) = after.find('}')
        {
            let var = &after[..end];
            rest = &after[end + 1..];
            match std::env::var(var) {
                Ok(v) => out.push_str(&v),
                Err(_) => return Err(unset(what, var)),
            }
            continue;
        }
        if let Some(after) = rest.strip_prefix("{file:")
            && let Some(end) = after.find('}')
        {
            let path = &after[..end];
            rest = &after[end + 1..];
            let text = std::fs::read_to_string(Path::new(path)).map_err(|source| {
                ResolveError::UnreadableFile {
                    what: what.to_string(),
                    path: path.to_string(),
                    source,
                }
            })?;
            out.push_str(text.trim_end_matches(['\n', '\r']));
            continue;
        }
        let c = rest.chars().next().expect("non-empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    Ok(out)
}

fn unset(what: &str, var: &str) -> ResolveError {
    ResolveError::UnsetVariable {
        what: what.to_string(),
        var: var.to_string(),
    }
}

/// A dotenv file: `KEY=value`, `export KEY=value`, `#` comments, single / double quotes.
pub(crate) fn parse_env_file(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let k = k.trim();
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let v = v.trim();
        let value = if let Some(q) = v.strip_prefix('"') {
            let body = q.rfind('"').map(|i| &q[..i]).unwrap_or(q);
            let mut s = String::new();
            let mut chars = body.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    match chars.next() {
                        Some('n') => s.push('\n'),
                        Some('t') => s.push('\t'),
                        Some(o) => s.push(o),
                        None => s.push('\\'),
                    }
                } else {
                    s.push(c);
                }
            }
            s
        } else if let Some(q) = v.strip_prefix('\'') {
            q.rfind('\'').map(|i| &q[..i]).unwrap_or(q).to_string()
        } else {
            match v.find(" #") {
                Some(i) => v[..i].trim_end().to_string(),
                None => v.to_string(),
            }
        };
        out.push((k.to_string(), value));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_expand_and_missing_ones_are_errors_without_values() {
        // SAFETY: test-only env mutation of a unique name.
        unsafe { std::env::set_var("MCB_POOL_TEST_TOKEN", "s3cret") };
        assert_eq!(
            expand("Bearer ${MCB_POOL_TEST_TOKEN}", "h").unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(expand("${env:MCB_POOL_TEST_TOKEN}", "h").unwrap(), "s3cret");
        assert_eq!(
            expand("{env:MCB_POOL_TEST_TOKEN}!", "h").unwrap(),
            "s3cret!"
        );
        assert_eq!(expand("${MCB_POOL_TEST_UNSET:-dflt}", "h").unwrap(), "dflt");
        assert_eq!(
            expand("plain $HOME {x} ${", "h").unwrap(),
            "plain $HOME {x} ${"
        );
        let e = expand("${MCB_POOL_TEST_UNSET}", "env.X").unwrap_err();
        assert!(
            matches!(&e, ResolveError::UnsetVariable { what, var } if what == "env.X" && var == "MCB_POOL_TEST_UNSET"),
            "{e}"
        );
        let e = expand("${input:token}", "env.X").unwrap_err();
        assert!(
            matches!(&e, ResolveError::InputVariable { input, .. } if input == "token"),
            "{e}"
        );
        assert_eq!(
            e.message(),
            "env.X uses the VS Code input variable ${input:token}, which the bridge cannot prompt for; put the value in env or env_file"
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tok");
        std::fs::write(&f, "from-file\n").unwrap();
        assert_eq!(
            expand(&format!("{{file:{}}}", f.display()), "e").unwrap(),
            "from-file"
        );
        let e = expand("{file:/nonexistent/x}", "env.T").unwrap_err();
        assert!(
            matches!(&e, ResolveError::UnreadableFile { what, .. } if what == "env.T"),
            "{e}"
        );
    }

    #[test]
    fn env_file_merges_under_env() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join(".env");
        std::fs::write(
            &f,
            "# comment\nA=1\nexport B=\"two words\\n\"\nC='lit $x'\nD=v # trailing\nbad line\nA_OVERRIDDEN=file\n",
        )
        .unwrap();
        let entry = ServerEntry {
            command: Some("srv".into()),
            env_file: Some(f),
            env: [("A_OVERRIDDEN".to_string(), "env".to_string())].into(),
            cwd: Some(dir.path().to_path_buf()),
            ..Default::default()
        };
        let Resolved::Stdio { env, cwd, .. } = resolve(&entry).unwrap() else {
            panic!()
        };
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "two words\n");
        assert_eq!(env["C"], "lit $x");
        assert_eq!(env["D"], "v");
        assert_eq!(env["A_OVERRIDDEN"], "env");
        assert_eq!(cwd.as_deref(), Some(dir.path()));
        let bad = ServerEntry {
            command: Some("srv".into()),
            cwd: Some("/nonexistent/dir".into()),
            ..Default::default()
        };
        assert!(matches!(
            resolve(&bad),
            Err(ResolveError::CwdNotADirectory { .. })
        ));
        let missing = ServerEntry {
            command: Some("srv".into()),
            env_file: Some("/nonexistent/.env".into()),
            ..Default::default()
        };
        assert!(matches!(
            resolve(&missing),
            Err(ResolveError::EnvFile { .. })
        ));
    }
}
