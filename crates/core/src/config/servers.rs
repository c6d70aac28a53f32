//! The [`ServerEntry`] schema: one server definition, as a `[servers.<name>]` table of the
//! bridge's TOML config or (read by upstream discovery) an `mcpServers` JSON entry.
//!
//! Nothing here reads a source or resolves a secret: references such as `${VAR}` stay as written
//! until the server starts (`upstream::secrets`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One server definition, as written in an `mcpServers` JSON entry or a `[servers.<name>]` TOML
/// table.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerEntry {
    /// The program a stdio server is started as; `None` for an HTTP server. Like every field
    /// but `description`, it may hold references (`${VAR}`) resolved when the server starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The program's arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Variables set for a stdio server, on top of the documented base environment; they win
    /// over `env_file`'s.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A file of `KEY=VALUE` lines read when the server starts, merged under `env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_file: Option<PathBuf>,
    /// The directory a stdio server runs in; `None`: the bridge's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The URL of an HTTP (streamable HTTP) server; set, the entry is an HTTP one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Headers sent with every request to an HTTP server (`Authorization = "Bearer ${TOKEN}"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// What the server is for, shown to the model (discovery, `describe_server()`); never
    /// resolved, so it holds no secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Start a stdio server with the bridge's whole environment instead of the documented base
    /// (`upstream::stdio::BASE_ENV`) plus `env`: for servers that read settings from variables
    /// nobody declared. Left out when false, so existing definitions keep their catalog digest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inherit_env: bool,
}

impl ServerEntry {
    /// `"stdio"` or `"http"` (meaningful only for a validated entry).
    pub fn transport(&self) -> &'static str {
        if self.url.is_some() { "http" } else { "stdio" }
    }

    /// A short, secret-free description of how the server is reached: the program for stdio
    /// servers (no arguments, which may carry tokens), scheme://host/path for HTTP servers (no
    /// query, no user info).
    pub fn target_summary(&self) -> String {
        if let Some(url) = &self.url {
            return format!("http {}", redact_url(url));
        }
        match &self.command {
            Some(c) => format!("stdio {c}"),
            None => "(nothing to start)".to_string(),
        }
    }
}

/// `scheme://host[:port]/path` without user info, query or fragment: a URL as logs and error
/// messages may show it (tokens often ride in the query or the user info).
pub fn redact_url(url: &str) -> String {
    let cut = url.find(['?', '#']).map(|i| &url[..i]).unwrap_or(url);
    match cut.split_once("://") {
        Some((scheme, rest)) => {
            let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
            format!("{scheme}://{rest}")
        }
        None => cut.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted_to_scheme_host_and_path() {
        assert_eq!(
            redact_url("https://user:pw@example.com:8443/mcp?token=t#f"),
            "https://example.com:8443/mcp"
        );
        assert_eq!(redact_url("not a url?x"), "not a url");
    }
}
