//! Where upstream server definitions come from: [`sources`] says where to look, [`entry`]
//! reads and checks one definition, [`jsonc`] makes commented JSON parseable, and [`discover`]
//! (here) reads them all in order and keeps the first definition of each name.
//!
//! Sources are read in the order of [`SOURCES`]; the first definition of a server name wins and
//! later definitions of the same name are reported as skipped ("already defined by ...").
//!
//! 1. `[servers.<name>]` tables of the bridge's TOML config (strict: unknown keys are errors,
//!    already enforced by the config loader);
//! 2. the file named by `servers_file` / `MCP_BRIDGE_SERVERS_FILE`;
//! 3. `~/MCPs/*.json` (sorted by file name);
//! 4. `$XDG_CONFIG_HOME/mcp/mcp.json` (what home-manager's `programs.mcp` writes);
//! 5. `$XDG_CONFIG_HOME/mcp/servers/*.json`;
//! 6. `~/.claude.json` (Claude Code): `projects[<current dir>].mcpServers`, then `mcpServers`;
//! 7. Claude Desktop's `claude_desktop_config.json` (`$XDG_CONFIG_HOME/Claude/` on Linux,
//!    `~/Library/Application Support/Claude/` on macOS);
//! 8. `./.mcp.json` (a project's servers, Claude Code's format);
//! 9. `./mcp-servers/*.json`;
//! 10. `./.vscode/mcp.json` (VS Code: a `servers` object, comments allowed).
//!
//! JSON files are read leniently: `//` and `/* */` comments and trailing commas are tolerated,
//! unknown keys (`type`, `alwaysAllow`, `autoApprove`, ...) are ignored, an entry with
//! `"disabled": true` or `"enabled": false` is skipped, `envFile` and `serverUrl` / `httpUrl` are
//! accepted as spellings of `env_file` and `url`, and an env value `{"file": "/path"}` becomes
//! `{file:/path}` (read when the server starts). A file-level `description` applies to the
//! file's servers that have none. Relative `cwd` / `env_file` paths resolve against the directory
//! of the file that names them (the project directory for the project sources 8-10), `~/` against
//! the home directory, and `${workspaceFolder}` / `${userHome}` are replaced by the project and home
//! directories. A file that cannot be read or parsed is a warning naming it; the other files still
//! load. An entry without exactly one of `command` and `url` is skipped with a reason, and so is
//! an entry that would start this bridge itself (unless `allow_self_server`).
//!
//! Values may reference secrets that are only resolved when the server is started
//! ([`crate::secrets`]): `${VAR}`, `${VAR:-default}`, `${env:VAR}`, `{env:VAR}` and
//! `{file:/path}`.

pub mod entry;
pub mod jsonc;
pub mod sources;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use bridge_core::error::Hinted as _;
use serde_json::Value;

pub use bridge_core::config::servers::{ServerEntry, redact_url};
pub use entry::{EntryError, launches_self};
pub use jsonc::parse_jsonc;
use sources::Place;
pub use sources::{DiscoveryContext, Origin, SOURCES, SourceKind, SourceSpec};

/// A server that will be offered.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveredEntry {
    /// The server's name: its key in the `mcpServers` (or `servers`) object or TOML table.
    pub name: String,
    /// The definition, secrets included: never send it to the sandbox.
    pub entry: ServerEntry,
    /// The source and file that defined it.
    pub origin: Origin,
}

/// A definition that is not offered, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkippedEntry {
    /// The name the definition is under.
    pub name: String,
    /// The source and file of the skipped definition.
    pub origin: Origin,
    /// Why it is not offered, as `servers` shows it: an [`EntryError`]'s message with its
    /// advice, "the server name is empty", or "already defined by <origin>" for a later
    /// definition of a name.
    pub reason: String,
}

/// A place that was looked at.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchedLocation {
    /// The source it belongs to.
    pub kind: SourceKind,
    /// The file, the missing directory, or `<dir>/*.json` for a directory without JSON files.
    pub path: PathBuf,
    /// Whether a file was there (and read, successfully or not).
    pub found: bool,
}

/// The outcome of discovery.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    /// Offered servers, sorted by name.
    pub servers: Vec<DiscoveredEntry>,
    /// Definitions not offered, with why, in the order they were read.
    pub skipped: Vec<SkippedEntry>,
    /// Files that could not be read or parsed, and other problems worth a line in the log.
    pub warnings: Vec<String>,
    /// Every place looked at, in precedence order, found or not.
    pub searched: Vec<SearchedLocation>,
}

impl Discovery {
    /// A discovery made of the given entries only (for tests and embedding).
    pub fn from_entries(entries: impl IntoIterator<Item = (String, ServerEntry)>) -> Self {
        let mut servers: Vec<DiscoveredEntry> = entries
            .into_iter()
            .map(|(name, entry)| DiscoveredEntry {
                name,
                entry,
                origin: Origin {
                    kind: SourceKind::Config,
                    path: None,
                    detail: None,
                },
            })
            .collect();
        servers.sort_by(|a, b| a.name.cmp(&b.name));
        servers.dedup_by(|a, b| a.name == b.name);
        Discovery {
            servers,
            ..Default::default()
        }
    }
}
/// Read every source (see the module docs for the order and rules).
pub fn discover(ctx: &DiscoveryContext) -> Discovery {
    let mut acc = Acc {
        ctx,
        out: Discovery::default(),
        taken: BTreeMap::new(),
    };

    for (name, entry) in &ctx.config_servers {
        let path = ctx.config_files.get(name).cloned();
        let origin = Origin {
            kind: SourceKind::Config,
            detail: path.as_ref().map(|_| format!("[servers.{name}]")),
            path,
        };
        acc.offer(name, entry.clone(), origin);
    }
    for (kind, place) in sources::places(ctx) {
        match place {
            Place::File(path) => {
                if !acc.read_file(kind, &path) && kind == SourceKind::ServersFile {
                    acc.out
                        .warnings
                        .push(format!("servers file {}: no such file", path.display()));
                }
            }
            Place::Dir(dir) => acc.read_dir(kind, &dir),
        }
    }

    let mut out = acc.out;
    out.servers.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

struct Acc<'a> {
    ctx: &'a DiscoveryContext,
    out: Discovery,
    /// name -> where it was first defined.
    taken: BTreeMap<String, Origin>,
}

impl Acc<'_> {
    /// Offer one definition: validate it and keep it unless the name is taken.
    fn offer(&mut self, name: &str, entry: ServerEntry, origin: Origin) {
        let skip = |acc: &mut Self, reason: String| {
            acc.out.skipped.push(SkippedEntry {
                name: name.to_string(),
                origin: origin.clone(),
                reason,
            })
        };
        if name.trim().is_empty() {
            return skip(self, "the server name is empty".into());
        }
        if let Some(first) = self.taken.get(name) {
            let reason = format!("already defined by {first}");
            return skip(self, reason);
        }
        if let Err(e) = entry::validate(&entry) {
            return skip(self, e.message());
        }
        if !self.ctx.allow_self_server
            && let Some(why) = launches_self(&entry, self.ctx.self_exe.as_deref())
        {
            return skip(self, EntryError::LaunchesSelf(why).message());
        }
        self.taken.insert(name.to_string(), origin.clone());
        self.out.servers.push(DiscoveredEntry {
            name: name.to_string(),
            entry,
            origin,
        });
    }

    /// Read every `*.json` of a directory, sorted by file name.
    fn read_dir(&mut self, kind: SourceKind, dir: &Path) {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.out.searched.push(SearchedLocation {
                    kind,
                    path: dir.to_path_buf(),
                    found: false,
                });
                return;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                self.out
                    .warnings
                    .push(format!("{}: not a directory", dir.display()));
                return;
            }
            Err(e) => {
                self.out
                    .warnings
                    .push(format!("{}: cannot list the directory: {e}", dir.display()));
                return;
            }
        };
        let mut files: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json") && !p.is_dir())
            .collect();
        files.sort();
        if files.is_empty() {
            self.out.searched.push(SearchedLocation {
                kind,
                path: dir.join("*.json"),
                found: false,
            });
        }
        for f in files {
            self.read_file(kind, &f);
        }
    }

    /// Read one file; returns whether it existed.
    fn read_file(&mut self, kind: SourceKind, path: &Path) -> bool {
        let text = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.out.searched.push(SearchedLocation {
                    kind,
                    path: path.to_path_buf(),
                    found: false,
                });
                return false;
            }
            Err(e) => {
                self.out.searched.push(SearchedLocation {
                    kind,
                    path: path.to_path_buf(),
                    found: true,
                });
                self.out
                    .warnings
                    .push(format!("{}: cannot read: {e}", path.display()));
                return true;
            }
        };
        self.out.searched.push(SearchedLocation {
            kind,
            path: path.to_path_buf(),
            found: true,
        });
        let text = match String::from_utf8(text) {
            Ok(t) => t,
            Err(_) => {
                self.out
                    .warnings
                    .push(format!("{}: not UTF-8 text", path.display()));
                return true;
            }
        };
        let root: Value = match parse_jsonc(&text) {
            Ok(v) => v,
            Err(e) => {
                self.out
                    .warnings
                    .push(format!("{}: not valid JSON: {e}", path.display()));
                return true;
            }
        };
        let Some(root) = root.as_object() else {
            self.out.warnings.push(format!(
                "{}: expected a JSON object at the top level",
                path.display()
            ));
            return true;
        };
        let base = if kind.is_project() {
            self.ctx.cwd.clone()
        } else {
            path.parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| self.ctx.cwd.clone())
        };
        let file_description = root
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_string);
        let origin = |detail: Option<String>| Origin {
            kind,
            path: Some(path.to_path_buf()),
            detail,
        };

        match kind {
            SourceKind::ClaudeCode => {
                // Project scope first (it wins in Claude Code too), then user scope.
                if let Some(projects) = root.get("projects").and_then(Value::as_object) {
                    let canonical = std::fs::canonicalize(&self.ctx.cwd).ok();
                    let keys = [Some(self.ctx.cwd.clone()), canonical];
                    let mut seen = BTreeSet::new();
                    for key in keys.into_iter().flatten() {
                        let key_s = key.to_string_lossy().to_string();
                        let found = projects
                            .get(&key_s)
                            .or_else(|| projects.get(key_s.trim_end_matches('/')));
                        if let Some(project) = found
                            && seen.insert(key_s.clone())
                            && let Some(servers) = project.get("mcpServers")
                        {
                            let o = origin(Some(format!("projects[{key_s:?}]")));
                            self.read_servers(servers, &o, &base, file_description.as_deref());
                        }
                    }
                }
                if let Some(servers) = root.get("mcpServers") {
                    self.read_servers(servers, &origin(None), &base, file_description.as_deref());
                }
            }
            SourceKind::ClaudeDesktop => {
                if let Some(servers) = root.get("mcpServers") {
                    self.read_servers(servers, &origin(None), &base, file_description.as_deref());
                }
            }
            _ => {
                let key = if kind == SourceKind::VsCode {
                    ["servers", "mcpServers"]
                } else {
                    ["mcpServers", "servers"]
                };
                match key.iter().find_map(|k| root.get(*k)) {
                    Some(servers) => self.read_servers(
                        servers,
                        &origin(None),
                        &base,
                        file_description.as_deref(),
                    ),
                    None => self.out.warnings.push(format!(
                        "{}: no \"{}\" object, nothing to load",
                        path.display(),
                        key[0]
                    )),
                }
            }
        }
        true
    }

    fn read_servers(
        &mut self,
        servers: &Value,
        origin: &Origin,
        base: &Path,
        file_description: Option<&str>,
    ) {
        let Some(servers) = servers.as_object() else {
            let where_ = origin
                .path
                .as_deref()
                .unwrap_or(Path::new("?"))
                .display()
                .to_string();
            self.out
                .warnings
                .push(format!("{where_}: the servers value is not a JSON object"));
            return;
        };
        for (name, value) in servers {
            match entry::parse_json_entry(value) {
                Ok(mut entry) => {
                    if entry.description.is_none() {
                        entry.description = file_description.map(str::to_string);
                    }
                    let entry = entry::normalize_paths(
                        entry,
                        base,
                        &self.ctx.cwd,
                        self.ctx.home.as_deref(),
                    );
                    self.offer(name, entry, origin.clone());
                }
                Err(e) => self.out.skipped.push(SkippedEntry {
                    name: name.clone(),
                    origin: origin.clone(),
                    reason: e.message(),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    struct Tree {
        _dir: tempfile::TempDir,
        home: PathBuf,
        project: PathBuf,
    }

    fn tree() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let project = dir.path().join("project");
        fs::create_dir_all(&home).unwrap();
        fs::create_dir_all(&project).unwrap();
        Tree {
            _dir: dir,
            home,
            project,
        }
    }

    fn ctx(t: &Tree) -> DiscoveryContext {
        DiscoveryContext {
            home: Some(t.home.clone()),
            xdg_config_home: None,
            cwd: t.project.clone(),
            servers_file: None,
            config_servers: BTreeMap::new(),
            config_files: BTreeMap::new(),
            allow_self_server: false,
            self_exe: Some(PathBuf::from("/opt/bridge/bin/mcp-code-bridge")),
        }
    }

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn one(name: &str, cmd: &str) -> String {
        format!(r#"{{"mcpServers": {{"{name}": {{"command": "{cmd}"}}}}}}"#)
    }

    fn find<'a>(d: &'a Discovery, name: &str) -> &'a DiscoveredEntry {
        d.servers
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} not found in {d:#?}"))
    }

    #[test]
    fn every_source_is_read_with_its_kind() {
        let t = tree();
        let cfg = t.home.join(".config");
        let sf = t.home.join("extra.json");
        write(&sf, &one("from_servers_file", "a"));
        write(&t.home.join("MCPs/b.json"), &one("from_mcps_b", "b"));
        write(&t.home.join("MCPs/a.json"), &one("from_mcps_a", "a"));
        write(&t.home.join("MCPs/notes.txt"), "not json");
        write(&cfg.join("mcp/mcp.json"), &one("from_xdg", "x"));
        write(&cfg.join("mcp/servers/s.json"), &one("from_xdg_dir", "x"));
        write(
            &t.home.join(".claude.json"),
            &format!(
                r#"{{"numStartups": 3, "mcpServers": {{"cc_user": {{"command": "u"}}}},
                    "projects": {{"{}": {{"mcpServers": {{"cc_project": {{"command": "p"}}}}}},
                                  "/elsewhere": {{"mcpServers": {{"cc_other": {{"command": "o"}}}}}}}}}}"#,
                t.project.display()
            ),
        );
        write(
            &cfg.join("Claude/claude_desktop_config.json"),
            &one("from_desktop", "d"),
        );
        write(
            &t.home
                .join("Library/Application Support/Claude/claude_desktop_config.json"),
            &one("from_desktop_mac", "d"),
        );
        write(&t.project.join(".mcp.json"), &one("from_project", "p"));
        write(
            &t.project.join("mcp-servers/z.json"),
            &one("from_project_dir", "p"),
        );
        write(
            &t.project.join(".vscode/mcp.json"),
            r#"{
                // VS Code allows comments
                "inputs": [],
                "servers": {
                    "from_vscode": {"type": "stdio", "command": "v", "args": ["--x",],},
                    "vscode_http": {"type": "http", "url": "http://127.0.0.1:1/mcp"}, /* trailing */
                },
            }"#,
        );
        let mut c = ctx(&t);
        c.servers_file = Some(sf.clone());
        c.config_servers.insert(
            "from_toml".into(),
            ServerEntry {
                command: Some("t".into()),
                ..Default::default()
            },
        );
        let d = discover(&c);
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        let kinds: Vec<(&str, SourceKind)> = d
            .servers
            .iter()
            .map(|s| (s.name.as_str(), s.origin.kind))
            .collect();
        use SourceKind::*;
        for (name, kind) in [
            ("from_toml", Config),
            ("from_servers_file", ServersFile),
            ("from_mcps_a", McpsDir),
            ("from_mcps_b", McpsDir),
            ("from_xdg", XdgMcpJson),
            ("from_xdg_dir", XdgMcpServersDir),
            ("cc_user", ClaudeCode),
            ("cc_project", ClaudeCode),
            ("from_desktop", ClaudeDesktop),
            ("from_desktop_mac", ClaudeDesktop),
            ("from_project", ProjectMcpJson),
            ("from_project_dir", ProjectServersDir),
            ("from_vscode", VsCode),
            ("vscode_http", VsCode),
        ] {
            assert!(
                kinds.contains(&(name, kind)),
                "{name} {kind:?} missing from {kinds:?}"
            );
        }
        assert!(
            !kinds.iter().any(|(n, _)| *n == "cc_other"),
            "another project's servers leaked"
        );
        assert_eq!(
            find(&d, "from_servers_file").origin.path.as_deref(),
            Some(sf.as_path())
        );
        assert!(
            find(&d, "cc_project")
                .origin
                .detail
                .as_deref()
                .unwrap()
                .contains("projects")
        );
        assert_eq!(find(&d, "from_vscode").entry.args, vec!["--x"]);
        assert_eq!(
            find(&d, "vscode_http").entry.url.as_deref(),
            Some("http://127.0.0.1:1/mcp")
        );
        // Sorted by name.
        let names: Vec<_> = d.servers.iter().map(|s| s.name.clone()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(SOURCES.len(), 10);
    }

    #[test]
    fn first_definition_wins_in_precedence_order() {
        let t = tree();
        let cfg = t.home.join(".config");
        write(&t.home.join("MCPs/a.json"), &one("dup", "from_mcps_a"));
        write(&t.home.join("MCPs/b.json"), &one("dup", "from_mcps_b"));
        write(&cfg.join("mcp/mcp.json"), &one("dup", "from_xdg"));
        write(&t.project.join(".mcp.json"), &one("dup", "from_project"));
        let d = discover(&ctx(&t));
        assert_eq!(
            find(&d, "dup").entry.command.as_deref(),
            Some("from_mcps_a")
        );
        assert_eq!(d.skipped.len(), 3, "{:#?}", d.skipped);
        assert!(
            d.skipped
                .iter()
                .all(|s| s.reason.starts_with("already defined by") && s.reason.contains("a.json"))
        );

        let mut c = ctx(&t);
        c.config_servers.insert(
            "dup".into(),
            ServerEntry {
                command: Some("from_toml".into()),
                ..Default::default()
            },
        );
        assert_eq!(
            find(&discover(&c), "dup").entry.command.as_deref(),
            Some("from_toml")
        );
    }

    #[test]
    fn xdg_config_home_is_honoured_and_home_manager_shape_reads() {
        let t = tree();
        let xdg = t.home.join("xdg");
        // What home-manager's programs.mcp writes.
        write(
            &xdg.join("mcp/mcp.json"),
            r#"{"mcpServers": {
                "context7": {"headers": {"CONTEXT7_API_KEY": "{env:CONTEXT7_API_KEY}"}, "type": "http", "url": "https://mcp.context7.com/mcp"},
                "everything": {"args": ["-y", "@modelcontextprotocol/server-everything"], "command": "npx",
                               "env": {"NPM_TOKEN": "{file:/run/secrets/npm-token}"}, "type": "stdio"},
                "off": {"command": "x", "enabled": false}
            }}"#,
        );
        write(&t.home.join(".config/mcp/mcp.json"), &one("ignored", "x"));
        let mut c = ctx(&t);
        c.xdg_config_home = Some(xdg);
        let d = discover(&c);
        assert!(d.servers.iter().all(|s| s.name != "ignored"));
        let ctx7 = find(&d, "context7");
        assert_eq!(
            ctx7.entry.headers["CONTEXT7_API_KEY"],
            "{env:CONTEXT7_API_KEY}"
        );
        assert_eq!(ctx7.entry.transport(), "http");
        assert_eq!(
            find(&d, "everything").entry.env["NPM_TOKEN"],
            "{file:/run/secrets/npm-token}"
        );
        let off = d.skipped.iter().find(|s| s.name == "off").unwrap();
        assert!(off.reason.contains("disabled"), "{}", off.reason);
    }

    #[test]
    fn broken_files_warn_and_others_still_load() {
        let t = tree();
        write(
            &t.home.join("MCPs/a_broken.json"),
            "{ \"mcpServers\": { nope",
        );
        write(&t.home.join("MCPs/b_array.json"), "[1, 2]");
        write(&t.home.join("MCPs/c_nokey.json"), "{\"other\": {}}");
        write(&t.home.join("MCPs/d_good.json"), &one("good", "g"));
        write(&t.home.join(".claude.json"), "{\"mcpServers\": 7}");
        let d = discover(&ctx(&t));
        assert_eq!(find(&d, "good").entry.command.as_deref(), Some("g"));
        assert_eq!(d.warnings.len(), 4, "{:#?}", d.warnings);
        assert!(
            d.warnings[0].contains("a_broken.json") && d.warnings[0].contains("not valid JSON")
        );
        assert!(d.warnings[1].contains("b_array.json"));
        assert!(d.warnings[2].contains("c_nokey.json") && d.warnings[2].contains("mcpServers"));
        assert!(d.warnings[3].contains(".claude.json"));
    }

    #[test]
    fn missing_servers_file_is_a_warning() {
        let t = tree();
        let mut c = ctx(&t);
        c.servers_file = Some(t.home.join("nope.json"));
        let d = discover(&c);
        assert!(d.warnings.iter().any(|w| w.contains("nope.json")));
    }

    #[test]
    fn lenient_entries_and_skip_reasons() {
        let t = tree();
        write(
            &t.home.join("MCPs/x.json"),
            r#"{"description": "team servers", "mcpServers": {
                "plain": {"command": "srv", "args": ["--port", 8080, true], "alwaysAllow": ["x"], "autoApprove": [], "transportType": "stdio"},
                "described": {"command": "srv", "description": "own description"},
                "off": {"command": "srv", "disabled": true},
                "neither": {"args": ["x"]},
                "both": {"command": "srv", "url": "http://localhost:1/mcp"},
                "badargs": {"command": "srv", "args": {"a": 1}},
                "notobj": "srv",
                "badurl": {"url": "ftp://x"},
                "rel": {"command": "srv", "cwd": "sub", "envFile": "../.env", "env": {"TOKEN": {"file": "/run/t"}}},
                "tilde": {"command": "~/bin/srv", "cwd": "~/work"},
                "windsurf": {"serverUrl": "https://example.com/mcp?token=s3cret"}
            }}"#,
        );
        let d = discover(&ctx(&t));
        let plain = find(&d, "plain");
        assert_eq!(plain.entry.args, vec!["--port", "8080", "true"]);
        assert_eq!(plain.entry.description.as_deref(), Some("team servers"));
        assert_eq!(
            find(&d, "described").entry.description.as_deref(),
            Some("own description")
        );
        let reason = |n: &str| {
            d.skipped
                .iter()
                .find(|s| s.name == n)
                .map(|s| s.reason.clone())
                .unwrap_or_default()
        };
        assert!(reason("off").contains("disabled"));
        assert!(reason("neither").contains("neither"));
        assert!(reason("both").contains("both"));
        assert!(reason("badargs").contains("args"));
        assert!(reason("notobj").contains("not a JSON object"));
        assert!(reason("badurl").contains("not an http"));
        let rel = find(&d, "rel");
        assert_eq!(
            rel.entry.cwd.as_deref(),
            Some(t.home.join("MCPs/sub").as_path())
        );
        assert_eq!(
            rel.entry.env_file.as_deref(),
            Some(t.home.join("MCPs/../.env").as_path())
        );
        assert_eq!(rel.entry.env["TOKEN"], "{file:/run/t}");
        let tilde = find(&d, "tilde");
        assert_eq!(
            tilde.entry.command.as_deref(),
            Some(t.home.join("bin/srv").to_str().unwrap())
        );
        assert_eq!(
            tilde.entry.cwd.as_deref(),
            Some(t.home.join("work").as_path())
        );
        let ws = find(&d, "windsurf");
        assert_eq!(ws.entry.target_summary(), "http https://example.com/mcp");
    }

    #[test]
    fn project_sources_resolve_against_the_project() {
        let t = tree();
        write(
            &t.project.join(".vscode/mcp.json"),
            r#"{"servers": {"v": {"command": "node", "args": ["${workspaceFolder}/srv.js"], "cwd": "tools"}}}"#,
        );
        let d = discover(&ctx(&t));
        let v = find(&d, "v");
        assert_eq!(
            v.entry.args,
            vec![format!("{}/srv.js", t.project.display())]
        );
        assert_eq!(
            v.entry.cwd.as_deref(),
            Some(t.project.join("tools").as_path())
        );
    }

    #[test]
    fn self_launching_entries_are_skipped_unless_allowed() {
        let t = tree();
        // A directory named like us, handed to a filesystem server, is not us.
        let checkout = t.home.join("src/mcp-code-bridge");
        fs::create_dir_all(&checkout).unwrap();
        write(
            &t.home.join("MCPs/x.json"),
            &serde_json::json!({"mcpServers": {
                "by_name": {"command": "mcp-code-bridge", "args": ["run"]},
                "by_path": {"command": "/opt/bridge/bin/mcp-code-bridge"},
                "by_nix": {"command": "nix", "args": ["run", "github:someone/mcp-code-bridge", "--", "run"]},
                "by_nix_attr": {"command": "nix", "args": ["run", ".#mcp-code-bridge"]},
                "by_nix_checkout": {"command": "nix", "args": ["run", checkout.to_str().unwrap()]},
                "by_sh": {"command": "sh", "args": ["-c", "exec mcp-code-bridge run"]},
                "by_abs_arg": {"command": "env", "args": ["FOO=1", "/usr/local/bin/mcp-code-bridge"]},
                "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", checkout.to_str().unwrap()]},
                "similar": {"command": "mcp-code-bridge-helper"},
                "cargo": {"command": "cargo", "args": ["run", "--manifest-path", "x/Cargo.toml"]}
            }})
            .to_string(),
        );
        let d = discover(&ctx(&t));
        let names: Vec<_> = d.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["cargo", "filesystem", "similar"]);
        for n in [
            "by_name",
            "by_path",
            "by_nix",
            "by_nix_attr",
            "by_nix_checkout",
            "by_sh",
            "by_abs_arg",
        ] {
            let s = d
                .skipped
                .iter()
                .find(|s| s.name == n)
                .unwrap_or_else(|| panic!("{n} not skipped"));
            assert!(
                s.reason.contains("start this bridge itself"),
                "{n}: {}",
                s.reason
            );
            assert!(s.reason.contains("MCP_BRIDGE_ALLOW_SELF_SERVER"));
        }
        let mut c = ctx(&t);
        c.allow_self_server = true;
        assert_eq!(discover(&c).servers.len(), 10);
    }

    #[test]
    fn no_home_means_only_project_and_config() {
        let t = tree();
        write(&t.project.join(".mcp.json"), &one("p", "p"));
        let mut c = ctx(&t);
        c.home = None;
        let d = discover(&c);
        assert_eq!(d.servers.len(), 1);
    }

    #[test]
    fn toml_servers_name_their_file_when_known() {
        let t = tree();
        let mut c = ctx(&t);
        for name in ["known", "unknown"] {
            c.config_servers.insert(
                name.into(),
                ServerEntry {
                    command: Some("srv".into()),
                    ..Default::default()
                },
            );
        }
        c.config_files.insert(
            "known".into(),
            PathBuf::from("/etc/mcp-code-bridge/config.toml"),
        );
        let d = discover(&c);
        assert_eq!(
            find(&d, "known").origin.to_string(),
            "/etc/mcp-code-bridge/config.toml [servers.known]"
        );
        assert_eq!(
            find(&d, "unknown").origin.to_string(),
            "[servers.<name>] in config.toml"
        );
    }
}
