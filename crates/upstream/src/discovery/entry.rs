//! One `mcpServers` entry: reading a lenient JSON entry into the [`ServerEntry`] schema (which
//! lives in config), checking it, making its paths absolute, and recognising an entry that would
//! start this bridge itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use bridge_core::config::servers::{ServerEntry, redact_url};
use bridge_core::error::{Hint, Hinted};

/// Why an entry is not offered. The text is the skip reason `servers` shows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// The entry under the server's name is not a JSON object.
    #[error("the entry is not a JSON object")]
    NotAnObject,
    /// The entry turns itself off: `"disabled": true` or `"enabled": false`.
    #[error("disabled in its file (\"{key}\": {value})")]
    Disabled {
        /// `disabled` or `enabled`.
        key: &'static str,
        /// The value that turned it off.
        value: bool,
    },
    /// A field that must be text is something else: the field's name (`command`, `cwd`, ...),
    /// or `env.<NAME>` / `headers.<NAME>` for a value of those maps that is an array or object.
    #[error("`{0}` is not a string")]
    NotAString(String),
    /// `env` or `headers` (the field named) is not an object.
    #[error("`{0}` is not an object")]
    NotAnObjectField(&'static str),
    /// An `env` value is an object but has no `"file"` path (the only object form allowed);
    /// holds `env.<NAME>`.
    #[error("`{0}` is an object without \"file\"")]
    FileWithoutPath(String),
    /// The field named (`inherit_env`) is not a boolean.
    #[error("`{0}` is not true or false")]
    NotABool(&'static str),
    /// `args` is a list with an item that is not a string, number or boolean.
    #[error("`args` must be a list of strings")]
    ArgsNotStrings,
    /// `args` is neither a list nor a single string.
    #[error("`args` is not a list")]
    ArgsNotAList,
    /// The entry names both a `command` and a `url`: it is unclear which server is meant.
    #[error("it has both `command` and `url`")]
    Both,
    /// The entry names neither a `command` nor a `url` (both absent or blank).
    #[error("it has neither `command` (a stdio server) nor `url` (an HTTP server)")]
    Neither,
    /// The `url` is neither `http://` nor `https://` (nor a `${VAR}` / `{env:VAR}` reference
    /// resolved at start); holds the URL, redacted.
    #[error("its url {0:?} is not an http:// or https:// URL")]
    NotHttp(String),
    /// Starting it would start this bridge itself (a loop of bridges), and
    /// `allow_self_server` is off; holds why, as [`launches_self`] says it.
    #[error("it would start this bridge itself ({0})")]
    LaunchesSelf(String),
}

impl Hinted for EntryError {
    /// What to do about it, when there is something to do.
    fn hint(&self) -> Option<Hint> {
        match self {
            EntryError::Both => Some(Hint::clause("give exactly one")),
            EntryError::LaunchesSelf(_) => Some(Hint::clause(
                "set MCP_BRIDGE_ALLOW_SELF_SERVER=1 to keep it",
            )),
            _ => None,
        }
    }
}

/// An entry must name exactly one of `command` and `url`.
pub fn validate(e: &ServerEntry) -> Result<(), EntryError> {
    let command = e
        .command
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty());
    let url = e.url.as_deref().map(str::trim).filter(|u| !u.is_empty());
    match (command, url) {
        (Some(_), Some(_)) => Err(EntryError::Both),
        (None, None) => Err(EntryError::Neither),
        (None, Some(u)) => {
            if u.starts_with("http://")
                || u.starts_with("https://")
                || u.starts_with("${")
                || u.starts_with("{env:")
            {
                Ok(())
            } else {
                Err(EntryError::NotHttp(redact_url(u)))
            }
        }
        (Some(_), None) => Ok(()),
    }
}

/// One lenient `mcpServers` entry.
pub fn parse_json_entry(v: &Value) -> Result<ServerEntry, EntryError> {
    let Some(o) = v.as_object() else {
        return Err(EntryError::NotAnObject);
    };
    for (key, value) in [("disabled", true), ("enabled", false)] {
        if o.get(key).and_then(Value::as_bool) == Some(value) {
            return Err(EntryError::Disabled { key, value });
        }
    }
    let string = |keys: &[&str]| -> Result<Option<String>, EntryError> {
        for k in keys {
            match o.get(*k) {
                None | Some(Value::Null) => continue,
                Some(Value::String(s)) => return Ok(Some(s.clone())),
                Some(_) => return Err(EntryError::NotAString(k.to_string())),
            }
        }
        Ok(None)
    };
    let scalar = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    };
    let map = |key: &'static str,
               allow_file: bool|
     -> Result<BTreeMap<String, String>, EntryError> {
        let mut out = BTreeMap::new();
        match o.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    let value = match v {
                        Value::Object(f) if allow_file => match f
                            .get("file")
                            .and_then(Value::as_str)
                        {
                            Some(path) => format!("{{file:{path}}}"),
                            None => return Err(EntryError::FileWithoutPath(format!("{key}.{k}"))),
                        },
                        Value::Null => continue,
                        other => scalar(other)
                            .ok_or_else(|| EntryError::NotAString(format!("{key}.{k}")))?,
                    };
                    out.insert(k.clone(), value);
                }
            }
            Some(_) => return Err(EntryError::NotAnObjectField(key)),
        }
        Ok(out)
    };
    let args = match o.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| scalar(v).ok_or(EntryError::ArgsNotStrings))
            .collect::<Result<_, _>>()?,
        Some(Value::String(s)) => vec![s.clone()],
        Some(_) => return Err(EntryError::ArgsNotAList),
    };
    let inherit_env = match o.get("inherit_env").or_else(|| o.get("inheritEnv")) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(EntryError::NotABool("inherit_env")),
    };
    Ok(ServerEntry {
        command: string(&["command"])?,
        args,
        env: map("env", true)?,
        env_file: string(&["env_file", "envFile"])?.map(PathBuf::from),
        cwd: string(&["cwd"])?.map(PathBuf::from),
        url: string(&["url", "serverUrl", "httpUrl"])?,
        headers: map("headers", false)?,
        description: string(&["description"])?,
        inherit_env,
    })
}

/// `~/`, `${workspaceFolder}`, `${userHome}`, and relative `cwd` / `env_file` (against `base`):
/// the paths an entry's file meant, made absolute where the file is known, so the entry means
/// the same whatever directory the server is started from.
pub fn normalize_paths(
    mut e: ServerEntry,
    base: &Path,
    workspace: &Path,
    home: Option<&Path>,
) -> ServerEntry {
    let ws = workspace.to_string_lossy().to_string();
    let user_home = home.map(|h| h.to_string_lossy().to_string());
    let subst = |s: &str| -> String {
        let mut s = s.replace("${workspaceFolder}", &ws);
        if let Some(h) = &user_home {
            s = s.replace("${userHome}", h);
        }
        s
    };
    e.command = e.command.map(|c| {
        let c = subst(&c);
        if c.starts_with("~/") {
            expand_tilde(Path::new(&c), home)
                .to_string_lossy()
                .to_string()
        } else {
            c
        }
    });
    e.args = e.args.iter().map(|a| subst(a)).collect();
    e.env = e.env.iter().map(|(k, v)| (k.clone(), subst(v))).collect();
    let fix = |p: PathBuf| -> PathBuf {
        let p = PathBuf::from(subst(&p.to_string_lossy()));
        let p = expand_tilde(&p, home);
        if p.is_relative() && !p.to_string_lossy().starts_with("${") {
            base.join(p)
        } else {
            p
        }
    };
    e.cwd = e.cwd.map(fix);
    e.env_file = e.env_file.map(fix);
    e
}

/// `~/x` -> `$HOME/x`.
pub fn expand_tilde(p: &Path, home: Option<&Path>) -> PathBuf {
    match (p.strip_prefix("~"), home) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => p.to_path_buf(),
    }
}

/// The base name of this program.
const SELF_NAME: &str = "mcp-code-bridge";

/// Why an entry would start this bridge, if it would: its command (or, for launchers such as
/// `nix run`, `npx`, `uvx`, `sh -c`, any argument) is `mcp-code-bridge` or our own executable.
/// An argument that is an existing directory named `mcp-code-bridge` (a checkout handed to a
/// filesystem server) only counts for `nix`, where it is a flake reference.
pub fn launches_self(entry: &ServerEntry, self_exe: Option<&Path>) -> Option<String> {
    let command = entry.command.as_deref()?.trim();
    let self_canon = self_exe.and_then(|p| std::fs::canonicalize(p).ok());
    let is_self_path = |tok: &str| -> bool {
        let Some(exe) = self_exe else { return false };
        let p = Path::new(tok);
        if p == exe {
            return true;
        }
        p.is_absolute() && self_canon.is_some() && std::fs::canonicalize(p).ok() == self_canon
    };
    // `dirs_count`: a directory named like us counts (commands, flake references).
    let names_self = |tok: &str, dirs_count: bool| -> bool {
        let tok = tok.trim_matches(|c| c == '"' || c == '\'');
        if tok.is_empty() {
            return false;
        }
        if is_self_path(tok) {
            return true;
        }
        // Flake references: `github:o/mcp-code-bridge`, `.#mcp-code-bridge`, `path:/x/mcp-code-bridge#default`.
        let (base, fragment) = match tok.split_once('#') {
            Some((b, f)) => (b, Some(f)),
            None => (tok, None),
        };
        if fragment.is_some_and(|f| f == SELF_NAME || f.ends_with(&format!(".{SELF_NAME}"))) {
            return true;
        }
        let base = base.split('?').next().unwrap_or(base).trim_end_matches('/');
        let last = base.rsplit(['/', ':']).next().unwrap_or(base);
        if last != SELF_NAME {
            return false;
        }
        dirs_count || fragment.is_some() || !Path::new(base).is_dir()
    };
    let program = Path::new(command)
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or(command);
    if command
        .split_whitespace()
        .next()
        .is_some_and(|c| names_self(c, true))
    {
        return Some(format!("its command is {command:?}"));
    }
    let nix = matches!(program, "nix" | "nix-shell" | "nix-run");
    for arg in &entry.args {
        for tok in arg.split_whitespace() {
            if names_self(tok, nix) {
                return Some(format!("its arguments name {tok:?}"));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn self_detection_follows_symlinks_to_our_exe() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("real-bridge");
        std::fs::write(&exe, "").unwrap();
        let link = dir.path().join("bridge-link");
        std::os::unix::fs::symlink(&exe, &link).unwrap();
        let e = ServerEntry {
            command: Some(link.to_string_lossy().into()),
            ..Default::default()
        };
        assert!(launches_self(&e, Some(&exe)).is_some());
        let other = ServerEntry {
            command: Some("/bin/true".into()),
            ..Default::default()
        };
        assert!(launches_self(&other, Some(&exe)).is_none());
    }

    #[test]
    fn entry_problems_are_typed() {
        let parse = |v: Value| parse_json_entry(&v).unwrap_err();
        assert_eq!(parse(json!("srv")), EntryError::NotAnObject);
        assert_eq!(
            parse(json!({"command": "x", "enabled": false})),
            EntryError::Disabled {
                key: "enabled",
                value: false
            }
        );
        assert_eq!(
            parse(json!({"command": "x", "env": {"T": {"path": "/x"}}})),
            EntryError::FileWithoutPath("env.T".into())
        );
        assert_eq!(
            parse(json!({"command": "x", "args": {"a": 1}})),
            EntryError::ArgsNotAList
        );
        assert_eq!(
            parse(json!({"command": "x", "inherit_env": "yes"})),
            EntryError::NotABool("inherit_env")
        );
        for key in ["inherit_env", "inheritEnv"] {
            assert!(
                parse_json_entry(&json!({"command": "x", key: true}))
                    .unwrap()
                    .inherit_env
            );
        }
        assert!(
            !parse_json_entry(&json!({"command": "x"}))
                .unwrap()
                .inherit_env
        );
        let both = ServerEntry {
            command: Some("x".into()),
            url: Some("http://h/mcp".into()),
            ..Default::default()
        };
        assert_eq!(validate(&both), Err(EntryError::Both));
        assert_eq!(
            EntryError::Both.message(),
            "it has both `command` and `url`; give exactly one"
        );
        let ftp = ServerEntry {
            url: Some("ftp://user:pw@h/x?token=t".into()),
            ..Default::default()
        };
        assert_eq!(validate(&ftp), Err(EntryError::NotHttp("ftp://h/x".into())));
    }
}
