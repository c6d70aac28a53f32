//! A real OpenID provider for the tests: npm's certified `oidc-provider`
//! (tests/fixtures/oidc/provider.mjs), started on a loopback port with keys of its own, issuing
//! JWT access tokens by the client-credentials grant (clients `alice`, `bob`, `carol` and
//! [`CIMD_CLIENT`]).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use bridge_core::config::OAuthConfig;

/// The fixture's client whose `client_id` is a Client ID Metadata Document URL.
pub const CIMD_CLIENT: &str = "https://client.test/mcp/client-metadata.json";

/// A running provider; killed when dropped.
pub struct Provider {
    child: Child,
    pub issuer: String,
    _dir: tempfile::TempDir,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test servers' npm tree, where `scripts/setup-debian.sh --test-deps` installs
/// oidc-provider and jose.
pub fn node_modules() -> PathBuf {
    let bin = super::server_bin("mcp-server-everything");
    let dir = bin
        .parent()
        .and_then(|b| b.parent())
        .map(|s| s.join("npm/node_modules"))
        .filter(|d| d.join("oidc-provider").is_dir());
    dir.unwrap_or_else(|| {
        panic!(
            "oidc-provider is not installed beside the test servers ({}); \
             scripts/setup-debian.sh --test-deps installs it",
            bin.display()
        )
    })
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Provider {
    pub fn start() -> Provider {
        // ESM resolves packages from the importing file's directory: the fixture runs from a
        // directory whose node_modules is the test servers'.
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(node_modules(), dir.path().join("node_modules")).unwrap();
        let script = dir.path().join("provider.mjs");
        std::fs::copy(super::fixture("oidc/provider.mjs"), &script).unwrap();
        let port = free_port();
        let mut child = Command::new(super::server_bin("node"))
            .arg(&script)
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start node");
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert!(
            line.starts_with("ready "),
            "the provider did not start: {line:?}"
        );
        Provider {
            child,
            issuer: line["ready ".len()..].trim().to_string(),
            _dir: dir,
        }
    }

    /// An access token of `client` for `resource` (client-credentials grant).
    pub async fn token(&self, client: &str, resource: &str) -> String {
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        // client_secret_basic: the form-encoded id and secret, base64'd (RFC 6749 2.3.1).
        use base64::Engine as _;
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            enc(client),
            enc(&format!("{client}-secret"))
        ));
        let body = format!(
            "grant_type=client_credentials&scope=mcp&resource={}",
            enc(resource)
        );
        let resp = reqwest::Client::new()
            .post(format!("{}/token", self.issuer))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("authorization", format!("Basic {basic}"))
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let v: serde_json::Value = resp.json().await.unwrap();
        assert!(status.is_success(), "token request refused: {v}");
        v["access_token"].as_str().unwrap().to_string()
    }

    pub async fn jwks_hits(&self) -> u64 {
        let v: serde_json::Value = reqwest::get(format!("{}/test/jwks-hits", self.issuer))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["hits"].as_u64().unwrap()
    }

    pub fn config(&self, audience: &str) -> OAuthConfig {
        OAuthConfig {
            issuer: Some(self.issuer.clone()),
            audience: Some(audience.into()),
            ..OAuthConfig::default()
        }
    }

    /// This provider's config with `others` as `oauth.other_issuers`.
    pub fn config_with(&self, audience: &str, others: &[&Provider]) -> OAuthConfig {
        let mut config = self.config(audience);
        config.other_issuers.0 = others.iter().map(|p| p.issuer.clone()).collect();
        config
    }
}

/// The audience of a `serve` listening on `port`: its own URL.
pub fn audience(port: u16) -> String {
    format!("http://127.0.0.1:{port}/mcp")
}

/// `serve` on `port` (chosen first, since the audience names it) accepting tokens of `issuers`
/// for [`audience`]: the first as `oauth.issuer`, the others as `oauth.other_issuers`; no pool.
pub fn serve(port: u16, issuers: &[&Provider]) -> super::served::Served {
    let (first, others) = issuers.split_first().expect("at least one issuer");
    let others = others
        .iter()
        .map(|p| p.issuer.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let audience = audience(port);
    let mut env = vec![
        ("MCP_BRIDGE_OAUTH_ISSUER", first.issuer.as_str()),
        ("MCP_BRIDGE_OAUTH_AUDIENCE", audience.as_str()),
        ("MCP_BRIDGE_POOL_SIZE", "0"),
    ];
    if !others.is_empty() {
        env.push(("MCP_BRIDGE_OAUTH_OTHER_ISSUERS", others.as_str()));
    }
    super::served::Served::start(
        super::Home::new(),
        &env,
        &["--listen", &format!("127.0.0.1:{port}")],
    )
}
