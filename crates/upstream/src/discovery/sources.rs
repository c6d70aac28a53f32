//! The sources of server definitions: the [`SOURCES`] table (what `servers` and the docs show),
//! what discovery knows of the machine ([`DiscoveryContext`]), and [`places`], where on this
//! machine each source's files are looked for. Both are in precedence order; the rest of
//! discovery reads what they name.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::entry::expand_tilde;
use bridge_core::config::servers::ServerEntry;

/// What discovery needs to know about the machine.
#[derive(Debug, Clone, Default)]
pub struct DiscoveryContext {
    /// The home directory (`$HOME`); sources under it are not read without one.
    pub home: Option<PathBuf>,
    /// `$XDG_CONFIG_HOME`, or `None` for `~/.config`.
    pub xdg_config_home: Option<PathBuf>,
    /// The project directory (normally the current directory).
    pub cwd: PathBuf,
    /// `servers_file` / `MCP_BRIDGE_SERVERS_FILE`.
    pub servers_file: Option<PathBuf>,
    /// `[servers.<name>]` from the TOML config.
    pub config_servers: BTreeMap<String, ServerEntry>,
    /// The TOML file that defined each of `config_servers`, when known (the config is layered
    /// from several files), so `servers` can name it.
    pub config_files: BTreeMap<String, PathBuf>,
    /// Keep entries that would launch this bridge.
    pub allow_self_server: bool,
    /// Our own executable, for self-detection.
    pub self_exe: Option<PathBuf>,
}

impl DiscoveryContext {
    /// A context from this process's environment (`HOME`, `XDG_CONFIG_HOME`, the current
    /// directory, the current executable) and the given config values.
    pub fn from_env(
        config_servers: BTreeMap<String, ServerEntry>,
        servers_file: Option<PathBuf>,
        allow_self_server: bool,
    ) -> Self {
        let nonempty = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        DiscoveryContext {
            home: nonempty("HOME"),
            xdg_config_home: nonempty("XDG_CONFIG_HOME").filter(|p| p.is_absolute()),
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            servers_file,
            config_servers,
            config_files: BTreeMap::new(),
            allow_self_server,
            self_exe: std::env::current_exe().ok(),
        }
    }

    /// The user's configuration directory: `$XDG_CONFIG_HOME`, else `~/.config`; `None`
    /// without either.
    fn config_dir(&self) -> Option<PathBuf> {
        self.xdg_config_home
            .clone()
            .or_else(|| self.home.as_ref().map(|h| h.join(".config")))
    }
}

/// Which kind of place a server definition came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// `[servers.<name>]` in the bridge's TOML config.
    Config,
    /// `servers_file` / `MCP_BRIDGE_SERVERS_FILE`.
    ServersFile,
    /// `~/MCPs/*.json`.
    McpsDir,
    /// `$XDG_CONFIG_HOME/mcp/mcp.json`.
    XdgMcpJson,
    /// `$XDG_CONFIG_HOME/mcp/servers/*.json`.
    XdgMcpServersDir,
    /// `~/.claude.json`.
    ClaudeCode,
    /// Claude Desktop's `claude_desktop_config.json`.
    ClaudeDesktop,
    /// `./.mcp.json`.
    ProjectMcpJson,
    /// `./mcp-servers/*.json`.
    ProjectServersDir,
    /// `./.vscode/mcp.json`.
    VsCode,
}

/// A source of server definitions, for docs and the `servers` subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SourceSpec {
    /// Which source this is.
    pub kind: SourceKind,
    /// Where it is, as users write it.
    pub location: &'static str,
    /// What is read there.
    pub format: &'static str,
}

/// Every source of server definitions, in precedence order (the first definition of a name wins).
pub const SOURCES: &[SourceSpec] = &[
    SourceSpec {
        kind: SourceKind::Config,
        location: "[servers.<name>] in config.toml",
        format: "TOML tables (strict keys)",
    },
    SourceSpec {
        kind: SourceKind::ServersFile,
        location: "$MCP_BRIDGE_SERVERS_FILE (servers_file)",
        format: "{\"mcpServers\": {...}}",
    },
    SourceSpec {
        kind: SourceKind::McpsDir,
        location: "~/MCPs/*.json",
        format: "{\"mcpServers\": {...}}",
    },
    SourceSpec {
        kind: SourceKind::XdgMcpJson,
        location: "$XDG_CONFIG_HOME/mcp/mcp.json",
        format: "{\"mcpServers\": {...}} (home-manager programs.mcp)",
    },
    SourceSpec {
        kind: SourceKind::XdgMcpServersDir,
        location: "$XDG_CONFIG_HOME/mcp/servers/*.json",
        format: "{\"mcpServers\": {...}}",
    },
    SourceSpec {
        kind: SourceKind::ClaudeCode,
        location: "~/.claude.json",
        format: "projects[<cwd>].mcpServers, then mcpServers (Claude Code)",
    },
    SourceSpec {
        kind: SourceKind::ClaudeDesktop,
        location: "$XDG_CONFIG_HOME/Claude/claude_desktop_config.json, ~/Library/Application Support/Claude/claude_desktop_config.json",
        format: "{\"mcpServers\": {...}} (Claude Desktop)",
    },
    SourceSpec {
        kind: SourceKind::ProjectMcpJson,
        location: "./.mcp.json",
        format: "{\"mcpServers\": {...}}",
    },
    SourceSpec {
        kind: SourceKind::ProjectServersDir,
        location: "./mcp-servers/*.json",
        format: "{\"mcpServers\": {...}}",
    },
    SourceSpec {
        kind: SourceKind::VsCode,
        location: "./.vscode/mcp.json",
        format: "{\"servers\": {...}} (VS Code, JSONC)",
    },
];

impl SourceKind {
    /// This kind's entry in [`SOURCES`].
    pub fn spec(self) -> &'static SourceSpec {
        SOURCES
            .iter()
            .find(|s| s.kind == self)
            .expect("every kind is in SOURCES")
    }

    /// Project sources resolve relative paths against the project (current) directory.
    pub(super) fn is_project(self) -> bool {
        matches!(
            self,
            SourceKind::ProjectMcpJson | SourceKind::ProjectServersDir | SourceKind::VsCode
        )
    }
}

/// Where one definition came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin {
    /// The source it was read from.
    pub kind: SourceKind,
    /// The file, when known (a `[servers.<name>]` table whose config file was not passed in
    /// [`DiscoveryContext::config_files`] has `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Where inside the file, when it matters (`projects["/src/app"]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}", p.display())?,
            None => write!(f, "{}", self.kind.spec().location)?,
        }
        if let Some(d) = &self.detail {
            write!(f, " {d}")?;
        }
        Ok(())
    }
}

/// A place to read: one file, or every `*.json` of a directory (sorted by file name).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Place {
    File(PathBuf),
    Dir(PathBuf),
}

/// Where the file sources are looked for on this machine, in precedence order (the TOML
/// `[servers]` tables come first and are not files). Sources under the home or config directory
/// are left out when there is none. Claude Desktop's two locations are both read, the
/// platform's own first.
pub(super) fn places(ctx: &DiscoveryContext) -> Vec<(SourceKind, Place)> {
    use Place::{Dir, File};
    use SourceKind::*;
    let mut out = Vec::new();
    if let Some(file) = &ctx.servers_file {
        out.push((ServersFile, File(expand_tilde(file, ctx.home.as_deref()))));
    }
    let config = ctx.config_dir();
    if let Some(home) = &ctx.home {
        out.push((McpsDir, Dir(home.join("MCPs"))));
    }
    if let Some(config) = &config {
        out.push((XdgMcpJson, File(config.join("mcp").join("mcp.json"))));
        out.push((XdgMcpServersDir, Dir(config.join("mcp").join("servers"))));
    }
    if let Some(home) = &ctx.home {
        out.push((ClaudeCode, File(home.join(".claude.json"))));
    }
    let mut desktop = Vec::new();
    if let Some(config) = &config {
        desktop.push(config.join("Claude").join("claude_desktop_config.json"));
    }
    if let Some(home) = &ctx.home {
        desktop.push(
            home.join("Library/Application Support/Claude")
                .join("claude_desktop_config.json"),
        );
    }
    if cfg!(target_os = "macos") {
        desktop.reverse();
    }
    out.extend(desktop.into_iter().map(|p| (ClaudeDesktop, File(p))));
    out.push((ProjectMcpJson, File(ctx.cwd.join(".mcp.json"))));
    out.push((ProjectServersDir, Dir(ctx.cwd.join("mcp-servers"))));
    out.push((VsCode, File(ctx.cwd.join(".vscode").join("mcp.json"))));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_display_their_file() {
        let o = Origin {
            kind: SourceKind::ClaudeCode,
            path: Some("/h/.claude.json".into()),
            detail: Some("projects[\"/p\"]".into()),
        };
        assert_eq!(o.to_string(), "/h/.claude.json projects[\"/p\"]");
        let o = Origin {
            kind: SourceKind::Config,
            path: None,
            detail: None,
        };
        assert_eq!(o.to_string(), "[servers.<name>] in config.toml");
    }

    #[test]
    fn places_follow_the_table_and_honour_xdg() {
        let ctx = DiscoveryContext {
            home: Some("/h".into()),
            xdg_config_home: Some("/x".into()),
            cwd: "/p".into(),
            servers_file: Some("~/extra.json".into()),
            ..Default::default()
        };
        let found = places(&ctx);
        // Every file source, in the table's order (Config is the TOML, not a file).
        let mut kinds: Vec<SourceKind> = found.iter().map(|(k, _)| *k).collect();
        kinds.dedup();
        let table: Vec<SourceKind> = SOURCES.iter().skip(1).map(|s| s.kind).collect();
        assert_eq!(kinds, table);
        assert_eq!(
            found[0],
            (SourceKind::ServersFile, Place::File("/h/extra.json".into()))
        );
        assert!(found.contains(&(
            SourceKind::XdgMcpServersDir,
            Place::Dir("/x/mcp/servers".into())
        )));
        let no_home = places(&DiscoveryContext {
            cwd: "/p".into(),
            ..Default::default()
        });
        assert_eq!(no_home.len(), 3, "{no_home:?}");
    }
}
