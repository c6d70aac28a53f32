//! The OAuth resource server's token checks against a real OpenID provider: npm's certified
//! `oidc-provider` (tests/fixtures/oidc/provider.mjs), started here on loopback ports with keys of
//! its own, issuing JWT access tokens by the client-credentials grant. A token it signed for our
//! audience is accepted with its `sub` as the identity; an expired one, one for another audience,
//! one of another provider, a tampered one and an `HS256` one are refused, each with its reason, as
//! is one typed as another kind of JWT; discovery refuses an issuer its metadata does not name
//! (also by a trailing slash); tokens naming made-up keys cost the provider at most one key set
//! read; and with two providers trusted, each one's tokens are checked with its own keys only and
//! give identities of their own, a token claiming one issuer but signed with the other's key is
//! refused as such, one of an untrusted third is refused naming the key to set, and a client whose
//! client_id is a Client ID Metadata Document URL is accepted. The official Python and TypeScript
//! SDKs get their own tokens by the server's metadata, in both of their modes.

use crate::common;

use common::oidc::{CIMD_CLIENT, Provider, free_port};

use std::time::Duration;

use base64::Engine as _;
use bridge_core::config::OAuthConfig;
use bridge_core::error::Hinted as _;
use mcp_code_bridge::oauth::{OAuthError, TokenError, Verifier};

const AUDIENCE: &str = "http://127.0.0.1:8931/mcp";

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
    let id = verifier.verify(&alice).await.unwrap();
    assert_eq!((id.subject.as_str(), id.name.as_str()), ("alice", "alice"));
    assert_eq!(id.issuer, provider.issuer);
    assert_eq!(id.client.as_deref(), Some("alice"));
    let bob = provider.token("bob", AUDIENCE).await;
    assert_eq!(verifier.verify(&bob).await.unwrap().subject, "bob");

    // The provider types its access tokens `at+jwt` (RFC 9068); the same token typed as a
    // DPoP proof is refused as not an access token, before its key or signature.
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (head, rest) = alice.split_once('.').unwrap();
    let mut header: serde_json::Value = serde_json::from_slice(&b64.decode(head).unwrap()).unwrap();
    assert_eq!(header["typ"], "at+jwt", "{header}");
    header["typ"] = "dpop+jwt".into();
    let retyped = format!("{}.{rest}", b64.encode(header.to_string()));
    assert_eq!(
        verifier.verify(&retyped).await,
        Err(TokenError::NotAnAccessToken("dpop+jwt".into()))
    );

    // Another audience of the same issuer.
    let elsewhere = provider.token("alice", "https://other.test/").await;
    assert_eq!(
        verifier.verify(&elsewhere).await,
        Err(TokenError::WrongAudience(AUDIENCE.into()))
    );

    // Another provider, not configured: refused by its iss before any key is looked at.
    let foreign = other.token("alice", AUDIENCE).await;
    assert_eq!(
        verifier.verify(&foreign).await,
        Err(TokenError::UntrustedIssuer {
            found: other.issuer.clone(),
            trusted: provider.issuer.clone()
        })
    );
    // ... and claiming this issuer, with the other's key: a key this issuer does not publish.
    let mut claims = claims_of(&foreign);
    claims["iss"] = provider.issuer.clone().into();
    assert!(
        matches!(
            verifier.verify(&with_claims(&foreign, &claims)).await,
            Err(TokenError::UnknownKey { ref issuer, .. }) if *issuer == provider.issuer
        ),
        "{:?}",
        verifier.verify(&with_claims(&foreign, &claims)).await
    );

    // Tampered: alice's token claiming to be bob's.
    let mut claims = claims_of(&alice);
    claims["sub"] = "bob".into();
    assert_eq!(
        verifier.verify(&with_claims(&alice, &claims)).await,
        Err(TokenError::BadSignature(provider.issuer.clone()))
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
            Err(TokenError::UnknownKey { .. })
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
        ..OAuthConfig::default()
    })
    .await
    .err()
    .expect("a renamed issuer is refused");
    assert!(matches!(err, OAuthError::IssuerMismatch { .. }), "{err}");
    assert!(
        err.hint()
            .unwrap()
            .text()
            .contains("character for character")
    );
    // Identical means identical: a trailing slash the metadata does not have is refused too.
    let err = Verifier::discover(&OAuthConfig {
        issuer: Some(format!("{}/", provider.issuer)),
        audience: Some(AUDIENCE.into()),
        ..OAuthConfig::default()
    })
    .await
    .err()
    .expect("an issuer with a trailing slash its metadata lacks is refused");
    assert!(
        matches!(&err, OAuthError::IssuerMismatch { found, .. } if *found == provider.issuer),
        "{err}"
    );
    // The same among other_issuers: the first is fine, the second's metadata names another.
    let other = Provider::start();
    let mut config = provider.config(AUDIENCE);
    config.other_issuers.0 = vec![other.issuer.replace("127.0.0.1", "localhost")];
    let err = Verifier::discover(&config)
        .await
        .err()
        .expect("an other issuer its metadata does not name is refused");
    assert!(
        matches!(&err, OAuthError::IssuerMismatch { found, .. } if *found == other.issuer),
        "{err}"
    );
    assert!(err.hint().unwrap().text().contains("oauth.other_issuers"));
    // Nothing listens there.
    let err = Verifier::discover(&OAuthConfig {
        issuer: Some(format!("http://127.0.0.1:{}", free_port())),
        audience: Some(AUDIENCE.into()),
        ..OAuthConfig::default()
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

#[tokio::test(flavor = "multi_thread")]
async fn two_providers_each_with_its_own_keys_and_identities() {
    let first = Provider::start();
    let second = Provider::start();
    let third = Provider::start();
    let verifier = Verifier::discover(&first.config_with(AUDIENCE, &[&second]))
        .await
        .expect("discovery of both providers")
        .with_leeway(Duration::ZERO);
    assert_eq!(
        verifier.issuers(),
        [first.issuer.as_str(), second.issuer.as_str()]
    );

    // Both accepted; the same sub of the two is two identities, the first's unchanged.
    let alice1 = first.token("alice", AUDIENCE).await;
    let alice2 = second.token("alice", AUDIENCE).await;
    let one = verifier.verify(&alice1).await.unwrap();
    let two = verifier.verify(&alice2).await.unwrap();
    assert_eq!(
        (one.subject.as_str(), one.name.as_str()),
        ("alice", "alice")
    );
    assert_eq!(two.subject, "alice");
    assert_eq!(two.name, format!("alice@{}", second.issuer));
    assert_eq!(two.issuer, second.issuer);
    assert_ne!(one.name, two.name);

    // Key confusion: signed with the first's key, claiming the second: refused as such,
    // whichever way round.
    for (token, signer, claimed) in [(&alice1, &first, &second), (&alice2, &second, &first)] {
        let mut claims = claims_of(token);
        claims["iss"] = claimed.issuer.clone().into();
        let err = verifier
            .verify(&with_claims(token, &claims))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, TokenError::KeyOfAnotherIssuer { claimed: c, signer: s, .. }
                if *c == claimed.issuer && *s == signer.issuer),
            "{err:?}"
        );
        assert!(
            err.message().contains("keys of the issuer its iss names"),
            "{}",
            err.message()
        );
    }

    // An untrusted third provider: refused by its iss, naming the key that would trust it.
    let stranger = third.token("alice", AUDIENCE).await;
    let err = verifier.verify(&stranger).await.unwrap_err();
    assert!(
        matches!(&err, TokenError::UntrustedIssuer { found, .. } if *found == third.issuer),
        "{err:?}"
    );
    assert!(
        err.message().contains("oauth.other_issuers"),
        "{}",
        err.message()
    );

    // A Client ID Metadata Document client (its client_id an https URL): accepted, of either.
    for (provider, name) in [
        (&first, CIMD_CLIENT.to_string()),
        (&second, format!("{CIMD_CLIENT}@{}", second.issuer)),
    ] {
        let token = provider.token(CIMD_CLIENT, AUDIENCE).await;
        assert_eq!(claims_of(&token)["client_id"], CIMD_CLIENT);
        let id = verifier.verify(&token).await.unwrap();
        assert_eq!(id.client.as_deref(), Some(CIMD_CLIENT));
        assert!(id.client_is_metadata_document());
        assert_eq!(id.name, name);
    }
}

/// One client fixture's JSON line (the command is run to its end, its stderr shown on failure).
async fn fixture_json(command: &mut tokio::process::Command) -> serde_json::Value {
    let out = command.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// The official SDKs find their way in on their own, as the 2026-07-28 authorization flow has a
/// client do: no token given, only client credentials and the issuer they belong to. The Python
/// SDK's `ClientCredentialsOAuthProvider` and the TypeScript SDK's `ClientCredentialsProvider`
/// meet `serve`'s 401, follow its challenge to the Protected Resource Metadata, the provider's
/// metadata and token endpoint (asking for this resource), and call `run_python` with the token
/// they got, each in its default mode (2026-07-28) and in the legacy one (2025-11-25). The
/// identity is the token's subject whatever the client: alice's variable, set through Python, is
/// hers through TypeScript and not bob's. The Inspector CLI, whose OAuth flow is a login in a
/// browser, is let in with a token of the provider as a header.
#[tokio::test(flavor = "multi_thread")]
async fn the_sdks_get_their_own_tokens_by_the_servers_metadata_in_both_modes() {
    let provider = Provider::start();
    let port = free_port();
    let audience = common::oidc::audience(port);
    let served = common::oidc::serve(port, &[&provider]);
    let flow = vec![
        format!("GET 127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp"),
        format!(
            "GET {}/.well-known/oauth-authorization-server",
            provider.issuer.trim_start_matches("http://")
        ),
        format!(
            "POST {}/token",
            provider.issuer.trim_start_matches("http://")
        ),
    ];
    // The SDK's client fixture, with only the client's credentials and their issuer.
    let sdk = |fixture: &str, mode: &str, client: &str, code: &str| {
        let (program, fixture) = match fixture {
            "python" => ("mcp-python", "sdk_oauth_client.py"),
            _ => ("node", "ts_oauth_client.mjs"),
        };
        let mut c = tokio::process::Command::new(common::server_bin(program));
        c.arg(common::fixture(fixture))
            .args([mode, &served.url, &provider.issuer, client])
            .args([&format!("{client}-secret"), code])
            .env("NODE_PATH", common::oidc::node_modules());
        c
    };

    for (mode, protocol) in [("auto", "2026-07-28"), ("legacy", "2025-11-25")] {
        let set = fixture_json(&mut sdk("python", mode, "alice", "v = 'alice'\nprint(v)")).await;
        assert_eq!(set["protocol"], protocol, "{set}");
        assert_eq!(set["is_error"], false, "{set}");
        assert_eq!(set["structured"]["stdout"], "alice\n", "{set}");
        assert_eq!(set["requests"], serde_json::json!(flow), "{set}");
        let read = "print(globals().get('v'))";
        let hers = fixture_json(&mut sdk("typescript", mode, "alice", read)).await;
        assert_eq!(hers["protocol"], protocol, "{hers}");
        assert_eq!(hers["requests"], serde_json::json!(flow), "{hers}");
        let bobs = fixture_json(&mut sdk("typescript", mode, "bob", read)).await;
        assert_eq!(bobs["structured"]["stdout"], "None\n", "{bobs}");
        if mode == "auto" {
            // Under 2026-07-28 a connection's calls go to the identity's `default` session.
            assert_eq!(hers["structured"]["stdout"], "alice\n", "{hers}");
        }
    }

    // The Inspector CLI with a token of the provider.
    let token = provider.token("alice", &audience).await;
    let scratch = tempfile::tempdir().unwrap();
    let inspector = fixture_json(
        tokio::process::Command::new(common::server_bin("mcp-inspector"))
            .args(["--cli", &served.url, "--method", "tools/call"])
            .args([
                "--tool-name",
                "run_python",
                "--tool-arg",
                "code=print(6 * 7)",
            ])
            .args(["--header", &format!("Authorization: Bearer {token}")])
            .env("HOME", scratch.path()),
    )
    .await;
    assert_eq!(
        common::structured(&inspector)["stdout"],
        "42\n",
        "{inspector}"
    );
}
