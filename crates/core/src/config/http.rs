//! `serve`'s settings: `listen` and `token_file` (top-level keys, as the command line and the
//! environment name them) and the `[http]` section. The server itself is `crate::http`; this is
//! only its settings and their load-time checks.

use super::InvalidValue;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::values::{Secs, Size, empty_as_none, flexible_u32, list_or_string};

/// A list of strings: a TOML list, or one comma-separated string (environment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names(pub Vec<String>);

impl Serialize for Names {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Names {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        list_or_string(d, |s| s.split(',').map(str::to_string).collect()).map(Names)
    }
}

/// `[http]`: what `serve` accepts beyond authentication.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// `Host` values (name, or `name:port`) accepted besides the loopback names and the listen
    /// address; `*` accepts any (behind a proxy that checks it).
    #[serde(default)]
    pub allowed_hosts: Names,
    /// Browser `Origin`s (`scheme://host[:port]`, `:*` for any port) accepted besides loopback
    /// ones; a request with any other `Origin` is refused with 403.
    #[serde(default)]
    pub allowed_origins: Names,
    /// PEM certificate chain; with `tls_key`, `serve` speaks HTTPS.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub tls_key: Option<PathBuf>,
    /// The URL clients reach `/mcp` at (behind a proxy, the proxy's); the resource of the
    /// Protected Resource Metadata. Derived from each request's Host when unset.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub public_url: Option<String>,
    /// Most sandbox sessions one identity keeps alive (`max_sessions` bounds them all).
    #[serde(deserialize_with = "flexible_u32")]
    pub max_sessions_per_identity: u32,
    /// Most requests of one identity in flight at once; more get 429.
    #[serde(deserialize_with = "flexible_u32")]
    pub max_requests_per_identity: u32,
    /// Largest request body.
    pub max_request_size: Size,
    /// Most MCP sessions (`Mcp-Session-Id`) one identity keeps open; its next `initialize` gets
    /// 429. rmcp keeps an idle one for minutes, so without a bound one identity could hold
    /// memory for thousands.
    #[serde(deserialize_with = "flexible_u32")]
    pub max_mcp_sessions_per_identity: u32,
    /// Most connections open at once, whoever holds them (no token is needed to open one); the
    /// next is answered 503 and closed. Lowered at start to what the open-files limit allows.
    #[serde(deserialize_with = "flexible_u32")]
    pub max_connections: u32,
    /// How long a client has to send a request's headers (HTTP/1), and how long an idle
    /// keep-alive connection is kept; then the connection is closed.
    pub header_timeout: Secs,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            allowed_hosts: Names::default(),
            allowed_origins: Names::default(),
            tls_cert: None,
            tls_key: None,
            public_url: None,
            max_sessions_per_identity: 4,
            max_requests_per_identity: 8,
            max_request_size: Size(16 << 20),
            max_mcp_sessions_per_identity: 32,
            max_connections: 1024,
            header_timeout: Secs(std::time::Duration::from_secs(10)),
        }
    }
}

/// The address `serve` listens on when `listen` is not set.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8931";

/// `listen` as an address; `Err` says why not.
pub fn parse_listen(listen: &str) -> Result<SocketAddr, InvalidValue> {
    listen.parse().map_err(|error| InvalidValue::Address {
        text: listen.into(),
        error,
    })
}

impl HttpConfig {
    /// Range checks, as `Config::validate` reports them: the key at fault and why.
    pub(super) fn check(&self, listen: &str) -> Result<(), (&'static str, String)> {
        parse_listen(listen).map_err(|e| ("listen", e.to_string()))?;
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err((
                if self.tls_cert.is_some() {
                    "http.tls_key"
                } else {
                    "http.tls_cert"
                },
                "http.tls_cert and http.tls_key go together: set both for HTTPS, or neither".into(),
            ));
        }
        if self.max_sessions_per_identity == 0 {
            return Err((
                "http.max_sessions_per_identity",
                "0 would refuse every call; use at least 1".into(),
            ));
        }
        if self.max_requests_per_identity == 0 {
            return Err((
                "http.max_requests_per_identity",
                "0 would refuse every request; use at least 1".into(),
            ));
        }
        if self.max_mcp_sessions_per_identity == 0 {
            return Err((
                "http.max_mcp_sessions_per_identity",
                "0 would refuse every initialize; use at least 1".into(),
            ));
        }
        if self.max_connections < 16 {
            return Err((
                "http.max_connections",
                format!(
                    "{} is too few: a client holds a connection per SSE stream and one per call in flight; use at least 16",
                    self.max_connections
                ),
            ));
        }
        let t = self.header_timeout.0;
        if t < std::time::Duration::from_millis(100) || t > std::time::Duration::from_secs(300) {
            return Err((
                "http.header_timeout",
                format!(
                    "{} is out of range: below 100ms cuts off slow clients, above 5m lets idle connections pile up; use 100ms to 5m",
                    self.header_timeout
                ),
            ));
        }
        if self.max_request_size.0 < 64 << 10 {
            return Err((
                "http.max_request_size",
                format!(
                    "{} is too small for MCP requests; use at least 64k",
                    self.max_request_size
                ),
            ));
        }
        if let Some(u) = &self.public_url {
            match url::Url::parse(u) {
                Ok(url) if matches!(url.scheme(), "http" | "https") => {}
                _ => {
                    return Err((
                        "http.public_url",
                        format!("{u:?} must be an http(s) URL, like https://bridge.example/mcp"),
                    ));
                }
            }
        }
        for o in &self.allowed_origins.0 {
            if o != "null" && !o.contains("://") {
                return Err((
                    "http.allowed_origins",
                    format!("{o:?} needs a scheme, like https://{o}"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_name_the_key() {
        let ok = HttpConfig::default();
        assert!(ok.check(DEFAULT_LISTEN).is_ok());
        assert_eq!(ok.check("localhost").unwrap_err().0, "listen");
        let half = HttpConfig {
            tls_cert: Some("c.pem".into()),
            ..HttpConfig::default()
        };
        assert_eq!(half.check(DEFAULT_LISTEN).unwrap_err().0, "http.tls_key");
        let origin = HttpConfig {
            allowed_origins: Names(vec!["app.example".into()]),
            ..HttpConfig::default()
        };
        for (bad, key) in [
            (
                HttpConfig {
                    max_connections: 3,
                    ..HttpConfig::default()
                },
                "http.max_connections",
            ),
            (
                HttpConfig {
                    header_timeout: Secs(std::time::Duration::ZERO),
                    ..HttpConfig::default()
                },
                "http.header_timeout",
            ),
            (
                HttpConfig {
                    max_mcp_sessions_per_identity: 0,
                    ..HttpConfig::default()
                },
                "http.max_mcp_sessions_per_identity",
            ),
        ] {
            assert_eq!(bad.check(DEFAULT_LISTEN).unwrap_err().0, key);
        }
        assert!(
            origin
                .check(DEFAULT_LISTEN)
                .unwrap_err()
                .1
                .contains("https://app.example")
        );
    }
}
