//! The OAuth resource server's token checks against a real OpenID provider: npm's certified
//! `oidc-provider` (tests/fixtures/oidc/provider.mjs), started here on loopback ports with keys
//! of its own, issuing JWT access tokens by the client-credentials grant. A token it signed for
//! our audience is accepted with its `sub` as the identity; an expired one, one for another
//! audience, one of another provider, a tampered one and an `HS256` one are refused, each with
//! its reason; discovery refuses an issuer its metadata does not name; and tokens naming
//! made-up keys cost the provider at most one key set read.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use mcp_code_bridge::config::OAuthConfig;
use mcp_code_bridge::oauth::{OAuthError, TokenError, Verifier};

const AUDIENCE: &str = "http://127.0.0.1:8931/mcp";

/// A running provider; killed when dropped.
struct Provider {
    child: Child,
    issuer: String,
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
fn node_modules() -> PathBuf {
    let bin = common::server_bin("mcp-server-everything");
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Provider {
    fn start() -> Provider {
        // ESM resolves packages from the importing file's directory: the fixture runs from a
        // directory whose node_modules is the test servers'.
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(node_modules(), dir.path().join("node_modules")).unwrap();
        let script = dir.path().join("provider.mjs");
        std::fs::copy(common::fixture("oidc/provider.mjs"), &script).unwrap();
        let port = free_port();
        let mut child = Command::new(common::server_bin("node"))
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
    async fn token(&self, client: &str, resource: &str) -> String {
        let body = format!(
            "grant_type=client_credentials&client_id={client}&client_secret={client}-secret&scope=mcp&resource={}",
            percent_encoding::utf8_percent_encode(resource, percent_encoding::NON_ALPHANUMERIC)
        );
        let resp = reqwest::Client::new()
            .post(format!("{}/token", self.issuer))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let v: serde_json::Value = resp.json().await.unwrap();
        assert!(status.is_success(), "token request refused: {v}");
        v["access_token"].as_str().unwrap().to_string()
    }

    async fn jwks_hits(&self) -> u64 {
        let v: serde_json::Value = reqwest::get(format!("{}/test/jwks-hits", self.issuer))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["hits"].as_u64().unwrap()
    }

    fn config(&self, audience: &str) -> OAuthConfig {
        OAuthConfig {
            issuer: Some(self.issuer.clone()),
            audience: Some(audience.into()),
        }
    }
}

/// `token` with its claims replaced by `claims` (the signature left as it was).
fn with_claims(token: &str, claims: &serde_json::Value) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.{}",
        parts[0],
        b64.encode(serde_json::to_vec(claims).unwrap()),
        parts[2]
    )
}

fn claims_of(token: &str) -> serde_json::Value {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    serde_json::from_slice(&b64.decode(token.split('.').nth(1).unwrap()).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_of_a_real_provider_are_checked_claim_by_claim() {
    let provider = Provider::start();
    let other = Provider::start();
    let verifier = Verifier::discover(&provider.config(AUDIENCE))
        .await
        .expect("discovery of the provider")
        .with_leeway(Duration::ZERO);

    // Accepted: the identity is the token's subject (the client, for this grant).
    let alice = provider.token("alice", AUDIENCE).await;
    assert_eq!(verifier.verify(&alice).await.unwrap().subject, "alice");
    let bob = provider.token("bob", AUDIENCE).await;
    assert_eq!(verifier.verify(&bob).await.unwrap().subject, "bob");

    // Another audience of the same issuer.
    let elsewhere = provider.token("alice", "https://other.test/").await;
    assert_eq!(
        verifier.verify(&elsewhere).await,
        Err(TokenError::WrongAudience(AUDIENCE.into()))
    );

    // Another provider, whose key this issuer does not publish.
    let foreign = other.token("alice", AUDIENCE).await;
    assert!(
        matches!(
            verifier.verify(&foreign).await,
            Err(TokenError::UnknownKey(_))
        ),
        "{:?}",
        verifier.verify(&foreign).await
    );

    // Tampered: alice's token claiming to be bob's.
    let mut claims = claims_of(&alice);
    claims["sub"] = "bob".into();
    assert_eq!(
        verifier.verify(&with_claims(&alice, &claims)).await,
        Err(TokenError::BadSignature)
    );

    // HS256 "signed" with a published key as the secret, and `none`: refused before any key.
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let payload = b64.encode(serde_json::to_vec(&claims_of(&alice)).unwrap());
    for alg in ["HS256", "none"] {
        let header = b64.encode(format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#));
        let forged = format!("{header}.{payload}.c2lnbmF0dXJl");
        let refused = verifier.verify(&forged).await.unwrap_err();
        assert!(
            matches!(refused, TokenError::Algorithm(_) | TokenError::Malformed(_)),
            "{alg}: {refused:?}"
        );
    }
    assert!(matches!(
        verifier.verify("not a token").await,
        Err(TokenError::Malformed(_))
    ));
    assert_eq!(
        verifier.verify(&"a".repeat(20_000)).await,
        Err(TokenError::TooLong)
    );

    // Expired: a resource whose tokens live one second.
    let expired = Verifier::discover(&provider.config("https://expired.test/"))
        .await
        .unwrap()
        .with_leeway(Duration::ZERO);
    let short = provider.token("alice", "https://expired.test/").await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(expired.verify(&short).await, Err(TokenError::Expired));

    // Made-up key ids: at most one more read of the key set, however many tokens.
    let before = provider.jwks_hits().await;
    for i in 0..50 {
        let header = b64.encode(format!(r#"{{"alg":"RS256","kid":"made-up-{i}"}}"#));
        let forged = format!("{header}.{payload}.c2lnbmF0dXJl");
        assert!(matches!(
            verifier.verify(&forged).await,
            Err(TokenError::UnknownKey(_))
        ));
    }
    let reads = provider.jwks_hits().await - before;
    assert!(reads <= 1, "{reads} key set reads for 50 unknown keys");
    // And a good token still passes.
    assert_eq!(verifier.verify(&alice).await.unwrap().subject, "alice");
}

#[tokio::test(flavor = "multi_thread")]
async fn discovery_refuses_an_issuer_its_metadata_does_not_name() {
    let provider = Provider::start();
    // The same server under another name: its metadata names 127.0.0.1, not localhost.
    let renamed = provider.issuer.replace("127.0.0.1", "localhost");
    let err = Verifier::discover(&OAuthConfig {
        issuer: Some(renamed),
        audience: Some(AUDIENCE.into()),
    })
    .await
    .err()
    .expect("a renamed issuer is refused");
    assert!(matches!(err, OAuthError::IssuerMismatch { .. }), "{err}");
    assert!(err.hint().contains("character for character"));
    // Nothing listens there.
    let err = Verifier::discover(&OAuthConfig {
        issuer: Some(format!("http://127.0.0.1:{}", free_port())),
        audience: Some(AUDIENCE.into()),
    })
    .await
    .err()
    .expect("an unreachable issuer is refused");
    assert!(matches!(err, OAuthError::NoMetadata { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("/.well-known/oauth-authorization-server"),
        "{err}"
    );
}
