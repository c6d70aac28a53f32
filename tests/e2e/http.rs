//! `serve`: MCP over Streamable HTTP, through the real binary, real podman, rmcp's real HTTP
//! client, the official Python and TypeScript SDK clients, and a real OpenID provider. What
//! each test attacks: requests without or with a wrong token (401 and its challenge), a foreign
//! `Origin` or `Host` (403, before authentication), one identity reaching for another's
//! interpreter, files, skills or MCP session, too many requests of one identity (429), a client
//! that goes away mid-call, and SIGTERM with a call in flight.

use crate::common;

use std::time::{Duration, Instant};

use common::served::Served;
use common::{Home, Outcome};
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams};
use rmcp::service::RunningService;
use serde_json::{Value, json};

const ALICE: &str = "alice-0123456789abcdef0123";
const BOB: &str = "bob-fedcba9876543210fedcba98";

fn token_home() -> (Home, String) {
    let home = Home::new();
    let tokens = home.path().join("tokens");
    std::fs::write(&tokens, format!("# the team\nalice:{ALICE}\nbob:{BOB}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let path = tokens.display().to_string();
    (home, path)
}

async fn run(client: &RunningService<RoleClient, ()>, args: Value) -> Outcome {
    let params =
        CallToolRequestParams::new("run_python").with_arguments(args.as_object().cloned().unwrap());
    Outcome(
        tokio::time::timeout(Duration::from_secs(240), client.call_tool(params))
            .await
            .expect("run_python answered within 240 s")
            .expect("run_python over HTTP"),
    )
}

/// A raw POST of `body` to the server with these headers; the status, headers and body.
async fn post(
    url: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut req = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.body(body.to_string()).send().await.expect("POST");
    let status = resp.status().as_u16();
    let h = resp.headers().clone();
    (status, h, resp.text().await.unwrap_or_default())
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}})
}

/// A raw MCP session of 2025-11-25 opened with `authorization`; its id.
async fn open_session(url: &str, authorization: &str) -> String {
    let (status, h, body) = post(url, &[("authorization", authorization)], initialize()).await;
    assert_eq!(status, 200, "{body}");
    h["mcp-session-id"].to_str().unwrap().to_string()
}

#[test]
fn serve_refuses_a_public_address_without_authentication() {
    let home = Home::new();
    let out = home
        .command()
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("refusing to listen on 0.0.0.0:0 without authentication"),
        "{err}"
    );
    assert!(err.contains("hint: set token_file"), "{err}");
    // A token file that is not one is refused with the line at fault.
    let bad = home.path().join("bad-tokens");
    std::fs::write(&bad, "alice:short\n").unwrap();
    let out = home
        .command()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("MCP_BRIDGE_TOKEN_FILE", &bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("line 1") && err.contains("hint: write one `name:token`"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bearer_tokens_admit_their_identity_and_keep_identities_apart() {
    let (home, tokens) = token_home();
    let audit = home.path().join("audit.jsonl");
    let served = Served::start(
        home,
        &[
            ("MCP_BRIDGE_TOKEN_FILE", &tokens),
            ("MCP_BRIDGE_AUDIT_PATH", &audit.display().to_string()),
            ("MCP_BRIDGE_POOL_SIZE", "0"),
            ("MCP_BRIDGE_SKILLS_SAVE", "allow"),
        ],
        &[],
    );
    let url = served.url.clone();

    // 401: no token, a wrong one, another scheme; each with the RFC 6750 challenge.
    let (status, h, body) = post(&url, &[], initialize()).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(h["www-authenticate"], "Bearer realm=\"mcp-code-bridge\"");
    let (status, h, body) = post(
        &url,
        &[("authorization", "Bearer alice-0123456789abcdef0124")],
        initialize(),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert!(
        h["www-authenticate"]
            .to_str()
            .unwrap()
            .contains("error=\"invalid_token\"")
    );
    let (status, _, _) = post(
        &url,
        &[("authorization", &format!("Basic {ALICE}"))],
        initialize(),
    )
    .await;
    assert_eq!(status, 401);
    // 403 before authentication: a page elsewhere learns nothing, not even that a token is needed.
    let (status, h, body) = post(&url, &[("origin", "https://evil.example")], initialize()).await;
    assert_eq!(status, 403, "{body}");
    assert!(h.get("www-authenticate").is_none());
    assert!(body.contains("http.allowed_origins"), "{body}");
    let bearer = format!("Bearer {ALICE}");
    let (status, _, body) = post(
        &url,
        &[("authorization", &bearer), ("host", "rebound.example:80")],
        initialize(),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    // A loopback origin (the Inspector's web UI, say) is welcome.
    let (status, _, body) = post(
        &url,
        &[
            ("authorization", &bearer),
            ("origin", "http://localhost:6274"),
        ],
        initialize(),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // An MCP session (2025-11-25) is its creator's: bob cannot use alice's id.
    let (status, h, _) = post(&url, &[("authorization", &bearer)], initialize()).await;
    assert_eq!(status, 200);
    let sid = h["mcp-session-id"].to_str().unwrap().to_string();
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let common_headers = |token: &str| {
        vec![
            ("authorization", format!("Bearer {token}")),
            ("mcp-session-id", sid.clone()),
            ("mcp-protocol-version", "2025-11-25".to_string()),
        ]
    };
    let as_refs = |v: &Vec<(&'static str, String)>| {
        v.iter().map(|(k, v)| (*k, v.clone())).collect::<Vec<_>>()
    };
    let bob_h = as_refs(&common_headers(BOB));
    let bob_h: Vec<(&str, &str)> = bob_h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, _, body) = post(&url, &bob_h, list.clone()).await;
    assert_eq!(status, 404, "bob used alice's MCP session: {body}");
    let alice_h = as_refs(&common_headers(ALICE));
    let alice_h: Vec<(&str, &str)> = alice_h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    post(
        &url,
        &alice_h,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let (status, _, body) = post(&url, &alice_h, list).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("run_python"), "{body}");

    // Two identities, one session name: two interpreters.
    let alice = served.client(Some(ALICE)).await;
    let bob = served.client(Some(BOB)).await;
    run(&alice, json!({"code": "secret = 'alice-only'\nimport os\nos.makedirs('/workspace/out', exist_ok=True)\nopen('/workspace/out/mine.txt', 'w').write(secret)", "session": "work"})).await.ok();
    let seen = run(
        &bob,
        json!({"code": "print(globals().get('secret'))", "session": "work"}),
    )
    .await
    .ok();
    assert_eq!(seen.stdout().trim(), "None", "bob saw alice's variable");
    let again = run(&alice, json!({"code": "print(secret)", "session": "work"}))
        .await
        .ok();
    assert_eq!(again.stdout().trim(), "alice-only");

    // Files: alice's are listed for her only, and bob cannot read one by its URI.
    let mine = alice.list_all_resources().await.unwrap();
    let uri = mine
        .iter()
        .find(|r| r.name == "mine.txt")
        .expect("alice's file listed")
        .uri
        .clone();
    let bobs = bob.list_all_resources().await.unwrap();
    assert!(
        !bobs.iter().any(|r| r.uri == uri),
        "bob's list shows alice's file"
    );
    let read = bob
        .read_resource(ReadResourceRequestParams::new(uri.clone()))
        .await;
    assert!(read.is_err(), "bob read alice's file: {read:?}");
    assert!(
        alice
            .read_resource(ReadResourceRequestParams::new(uri))
            .await
            .is_ok()
    );

    // Skills: alice's saved function is defined in her next session, not in bob's.
    run(&alice, json!({"code": "from mcp import runtime\ndef twice(x):\n    \"\"\"Double it.\"\"\"\n    return 2 * x\nruntime.save_skill(twice)", "session": "skills"})).await.ok();
    let hers = run(
        &alice,
        json!({"code": "print(twice(21))", "session": "fresh"}),
    )
    .await
    .ok();
    assert_eq!(hers.stdout().trim(), "42");
    let his = run(&bob, json!({"code": "from mcp import runtime\nprint('twice' in globals(), runtime.list_skills())", "session": "fresh"})).await.ok();
    assert_eq!(his.stdout().trim(), "False []", "bob got alice's skill");

    // The audit log names who ran what.
    alice.cancel().await.ok();
    bob.cancel().await.ok();
    let mut served = served;
    let status = served
        .terminate(Duration::from_secs(60))
        .expect("serve exits after SIGTERM");
    assert!(status.success(), "{status:?}\n{}", served.home.log());
    let records: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let execs: Vec<(&str, &str)> = records
        .iter()
        .filter(|r| r["kind"] == "exec")
        .map(|r| {
            (
                r["identity"].as_str().unwrap_or("?"),
                r["session"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    assert!(
        execs.contains(&("alice", "work")) && execs.contains(&("bob", "work")),
        "{execs:?}"
    );
    let left = common::wait_no_containers(served.pid, Duration::from_secs(20)).await;
    assert!(left.is_empty(), "containers left after SIGTERM: {left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn one_identity_is_bounded_and_a_client_that_leaves_cancels_its_call() {
    let (home, tokens) = token_home();
    let served = Served::start(
        home,
        &[
            ("MCP_BRIDGE_TOKEN_FILE", &tokens),
            ("MCP_BRIDGE_HTTP_MAX_REQUESTS_PER_IDENTITY", "2"),
            ("MCP_BRIDGE_HTTP_MAX_SESSIONS_PER_IDENTITY", "1"),
            ("MCP_BRIDGE_POOL_SIZE", "0"),
        ],
        &[],
    );
    let alice = served.client(Some(ALICE)).await;
    run(&alice, json!({"code": "x = 1", "session": "a"}))
        .await
        .ok();
    // One session per identity: alice's second closes her first, and says so.
    let second = run(&alice, json!({"code": "print(1)", "session": "b"}))
        .await
        .ok();
    assert!(
        second.sc()["notices"]
            .to_string()
            .contains("session \\\"a\\\"")
            && second.sc()["notices"]
                .to_string()
                .contains("http.max_sessions_per_identity"),
        "{}",
        second.sc()
    );
    // Bob's session is not alice's to close.
    let bob = served.client(Some(BOB)).await;
    run(&bob, json!({"code": "y = 2", "session": "keep"}))
        .await
        .ok();
    run(&alice, json!({"code": "print(2)", "session": "c"}))
        .await
        .ok();
    let kept = run(&bob, json!({"code": "print(y)", "session": "keep"}))
        .await
        .ok();
    assert_eq!(kept.stdout().trim(), "2", "alice's sessions closed bob's");

    // Two calls of alice in flight: a third request of hers is 429, bob's is not.
    let slow = |c: &str| json!({"code": c, "session": "c", "timeout": 60});
    let calls: Vec<_> = (0..2)
        .map(|_| {
            let peer = alice.peer().clone();
            let params = CallToolRequestParams::new("run_python").with_arguments(
                slow("import time; time.sleep(4)")
                    .as_object()
                    .cloned()
                    .unwrap(),
            );
            tokio::spawn(async move { peer.call_tool(params).await.map(|r| r.is_error) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, h, body) = post(
        &served.url,
        &[("authorization", &format!("Bearer {ALICE}"))],
        initialize(),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(h["retry-after"], "1");
    assert!(body.contains("http.max_requests_per_identity"), "{body}");
    let tools = bob
        .list_all_tools()
        .await
        .expect("bob is not limited by alice's calls");
    assert_eq!(tools.len(), 1);
    for c in calls {
        assert_eq!(c.await.unwrap().expect("alice's call"), Some(false));
    }

    // A client that goes away mid-call cancels it: the code stops where it was, and the
    // session serves the next call at once instead of after the abandoned one. Over an MCP
    // session of 2025-11-25, raw, so that nothing but the closed connection says so.
    let bearer = format!("Bearer {ALICE}");
    let sid = open_session(&served.url, &bearer).await;
    let headers = [
        ("authorization", bearer.clone()),
        ("mcp-session-id", sid.clone()),
        ("mcp-protocol-version", "2025-11-25".to_string()),
    ];
    let refs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    post(
        &served.url,
        &refs,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let url = served.url.clone();
    let owned = headers.clone();
    let gone = tokio::spawn(async move {
        let refs: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        post(&url, &refs, json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": "run_python", "arguments": slow("import time\nfor i in range(40):\n    time.sleep(0.5)\nopen('/tmp/finished', 'w').write('yes')")}})).await
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    gone.abort();
    let _ = gone.await;
    let started = Instant::now();
    let after = run(
        &alice,
        json!({"code": "import os\nprint(os.path.exists('/tmp/finished'))", "session": "c"}),
    )
    .await
    .ok();
    assert_eq!(
        after.stdout().trim(),
        "False",
        "the abandoned call ran to its end ({:?})",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the next call waited for the abandoned one: {:?}",
        started.elapsed()
    );
}

/// The official clients over HTTP: the Python SDK's (`mcp` on PyPI), the TypeScript SDK's
/// (`@modelcontextprotocol/sdk` on npm) and the MCP Inspector's CLI, each with a bearer token,
/// each calling `run_python`.
#[tokio::test(flavor = "multi_thread")]
async fn the_official_clients_call_over_http() {
    let (home, tokens) = token_home();
    let served = Served::start(home, &[("MCP_BRIDGE_TOKEN_FILE", &tokens)], &[]);
    let py = tokio::process::Command::new(common::server_bin("mcp-python"))
        .arg(common::fixture("sdk_http_client.py"))
        .args([&served.url, ALICE, "print(6 * 7)"])
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&py.stdout);
    let err = String::from_utf8_lossy(&py.stderr);
    assert!(py.status.success(), "{out}\n{err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["structured"]["stdout"], "42\n", "{v}");
    assert_eq!(v["tools"], json!(["run_python"]));
    // Its close (DELETE of the MCP session) is answered as it expects, without a warning.
    assert!(!err.contains("Session termination failed"), "{err}");
    // The output streamed as progress over the call's SSE stream, as over stdio.
    let streamed: String = v["progress"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(streamed.contains("42"), "no progress: {v}");

    let ts = tokio::process::Command::new(common::server_bin("node"))
        .arg(common::fixture("sdk_http_client.mjs"))
        .args([&served.url, BOB, "print(6 * 7)"])
        .env("NODE_PATH", common::oidc::node_modules())
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&ts.stdout);
    assert!(
        ts.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&ts.stderr)
    );
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["structured"]["stdout"], "42\n", "{v}");
    assert_eq!(v["tools"], json!(["run_python"]));

    // The MCP Inspector's CLI (Node 22), with the token as a header.
    let scratch = tempfile::tempdir().unwrap();
    let inspector = tokio::process::Command::new(common::server_bin("mcp-inspector"))
        .args([
            "--cli",
            &served.url,
            "--method",
            "tools/call",
            "--tool-name",
            "run_python",
        ])
        .args([
            "--tool-arg",
            "code=print(6 * 7)",
            "--header",
            &format!("Authorization: Bearer {ALICE}"),
        ])
        .env("HOME", scratch.path())
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&inspector.stdout);
    assert!(
        inspector.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&inspector.stderr)
    );
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(common::structured(&v)["stdout"], "42\n", "{v}");

    // A wrong token: the Python client's error names the 401.
    let py = tokio::process::Command::new(common::server_bin("mcp-python"))
        .arg(common::fixture("sdk_http_client.py"))
        .args([&served.url, "not-a-token-of-this-server", "print(1)"])
        .output()
        .await
        .unwrap();
    assert!(!py.status.success());
}

/// `served`'s Protected Resource Metadata (RFC 9728), as a client reads it.
async fn protected_resource_metadata(served: &Served) -> Value {
    reqwest::get(format!(
        "{}/.well-known/oauth-protected-resource/mcp",
        served.base()
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap()
}

/// OAuth 2.1 resource server: tokens of a real OpenID provider, its metadata and challenge.
#[tokio::test(flavor = "multi_thread")]
async fn oauth_tokens_of_a_real_provider_are_accepted_or_refused() {
    let provider = common::oidc::Provider::start();
    // The audience names this server's URL, so its port is chosen first.
    let port = common::oidc::free_port();
    let audience = common::oidc::audience(port);
    // A token that lives a second, asked for first: it has expired (beyond the 30 s leeway)
    // by the end of the test.
    let short = provider.token("carol", &audience).await;
    let short_at = Instant::now();
    let served = common::oidc::serve(port, &[&provider]);
    assert_eq!(served.url, audience);

    // Protected Resource Metadata (RFC 9728), and the challenge that points at it.
    let prm = protected_resource_metadata(&served).await;
    assert_eq!(prm["resource"], audience.as_str());
    assert_eq!(prm["authorization_servers"], json!([provider.issuer]));
    let (status, h, _) = post(&served.url, &[], initialize()).await;
    assert_eq!(status, 401);
    assert_eq!(
        h["www-authenticate"].to_str().unwrap(),
        format!(
            "Bearer realm=\"mcp-code-bridge\", resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
            served.base()
        )
    );

    // Accepted: alice's token for this audience; her identity is the token's subject.
    let alice = provider.token("alice", &audience).await;
    let client = served.client(Some(&alice)).await;
    let out = run(&client, json!({"code": "v = 'from alice'\nprint(v)"}))
        .await
        .ok();
    assert_eq!(out.stdout().trim(), "from alice");
    // Bob's token reaches bob's interpreter, not alice's.
    let bob = provider.token("bob", &audience).await;
    let bobs = served.client(Some(&bob)).await;
    let seen = run(&bobs, json!({"code": "print(globals().get('v'))"}))
        .await
        .ok();
    assert_eq!(seen.stdout().trim(), "None");

    // Refused: a token for another audience of the same issuer, with its reason.
    let elsewhere = provider.token("alice", "https://other.test/").await;
    let (status, h, body) = post(
        &served.url,
        &[("authorization", &format!("Bearer {elsewhere}"))],
        initialize(),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    let challenge = h["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.contains("error=\"invalid_token\"") && challenge.contains("another audience"),
        "{challenge}"
    );

    // Refused: the expired one.
    let wait = Duration::from_secs(33).saturating_sub(short_at.elapsed());
    tokio::time::sleep(wait).await;
    let (status, _, body) = post(
        &served.url,
        &[("authorization", &format!("Bearer {short}"))],
        initialize(),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("expired"), "{body}");
}

/// OAuth with two trusted providers through `serve`: the metadata lists both, the same `sub` of
/// each is its own identity (its own interpreter), a Client ID Metadata Document client is let
/// in, and a token claiming one issuer but signed with the other's key, or one of an untrusted
/// issuer, gets a 401 whose challenge names the failed check and what to configure.
#[tokio::test(flavor = "multi_thread")]
async fn oauth_two_providers_through_serve() {
    let first = common::oidc::Provider::start();
    let second = common::oidc::Provider::start();
    let third = common::oidc::Provider::start();
    let port = common::oidc::free_port();
    let audience = common::oidc::audience(port);
    let served = common::oidc::serve(port, &[&first, &second]);
    let prm = protected_resource_metadata(&served).await;
    assert_eq!(
        prm["authorization_servers"],
        json!([first.issuer, second.issuer])
    );

    // alice of the second is not alice of the first: her interpreter is her own.
    let alice2 = second.token("alice", &audience).await;
    let theirs = served.client(Some(&alice2)).await;
    let out = run(&theirs, json!({"code": "v = 'second'\nprint(v)"}))
        .await
        .ok();
    assert_eq!(out.stdout().trim(), "second");
    let alice1 = first.token("alice", &audience).await;
    let ours = served.client(Some(&alice1)).await;
    let seen = run(&ours, json!({"code": "print(globals().get('v'))"}))
        .await
        .ok();
    assert_eq!(seen.stdout().trim(), "None");

    // A Client ID Metadata Document client of the second.
    let cimd = second.token(common::oidc::CIMD_CLIENT, &audience).await;
    let (status, _, body) = post(
        &served.url,
        &[("authorization", &format!("Bearer {cimd}"))],
        initialize(),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // Refused, each naming its check in the challenge: the first's key claiming the second ...
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = alice1.split('.').collect();
    let mut claims: Value = serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap();
    claims["iss"] = second.issuer.clone().into();
    let confused = format!(
        "{}.{}.{}",
        parts[0],
        b64.encode(serde_json::to_vec(&claims).unwrap()),
        parts[2]
    );
    // ... and a token of an issuer nobody configured.
    let stranger = third.token("alice", &audience).await;
    for (token, check, fix) in [
        (
            confused,
            format!("claims issuer {} but is signed with key", second.issuer),
            "keys of the issuer its iss names",
        ),
        (
            stranger,
            format!("issuer '{}' is not one this server trusts", third.issuer),
            "oauth.other_issuers",
        ),
    ] {
        let (status, h, body) = post(
            &served.url,
            &[("authorization", &format!("Bearer {token}"))],
            initialize(),
        )
        .await;
        assert_eq!(status, 401, "{body}");
        let challenge = h["www-authenticate"].to_str().unwrap();
        assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");
        assert!(challenge.contains(&check), "{challenge}");
        assert!(challenge.contains(fix), "{challenge}");
        assert!(challenge.contains("resource_metadata="), "{challenge}");
    }
}

/// A task is its creator's: another identity's `tasks/get` and `tasks/cancel` of its id are
/// refused as for an unknown task (and, in the 2025-11-25 form, `tasks/result`; `tasks/list`
/// does not show it), and the task runs on to its result.
#[tokio::test(flavor = "multi_thread")]
async fn another_identitys_task_is_unknown() {
    use rmcp::ServiceExt as _;
    use rmcp::model::{
        CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig, GetTaskParams,
        Implementation, RequestMetaObject,
    };
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let (home, tokens) = token_home();
    let served = Served::start(home, &[("MCP_BRIDGE_TOKEN_FILE", &tokens)], &[]);
    let connect = |token: &'static str| {
        let url = served.url.clone();
        async move {
            let transport = StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).auth_header(token),
            );
            ClientConfig::new(
                ClientCapabilities::builder().enable_tasks().build(),
                Implementation::new("tasks-over-http", "1"),
            )
            .serve(transport)
            .await
            .expect("initialize over HTTP")
        }
    };
    let alice = connect(ALICE).await;
    let bob = connect(BOB).await;
    let mut params = CallToolRequestParams::new("run_python").with_arguments(
        json!({"code": "import time; time.sleep(3); print('done')"})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let mut meta = RequestMetaObject::new();
    meta.set_client_capabilities(ClientCapabilities::builder().enable_tasks().build());
    params.meta = Some(meta);
    let task = match alice.call_tool_once(params).await.expect("tools/call") {
        CallToolResponse::Task(t) => t.task,
        other => panic!("expected a task, got {other:?}"),
    };
    let id = task.task_id.clone();
    let peek = bob.peer().get_task(GetTaskParams::new(id.clone())).await;
    assert!(peek.is_err(), "bob read alice's task: {peek:?}");
    let cancel = bob
        .peer()
        .cancel_task(CancelTaskParams::new(id.clone()))
        .await;
    assert!(cancel.is_err(), "bob cancelled alice's task: {cancel:?}");
    // Nor in the 2025-11-25 form: bob's tasks/list does not show it, tasks/result refuses it.
    let bearer = format!("Bearer {BOB}");
    let sid = open_session(&served.url, &bearer).await;
    let session = [
        ("authorization", bearer.as_str()),
        ("mcp-session-id", sid.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let answer = |body: String| -> Value {
        let json = body
            .lines()
            .find_map(|l| {
                l.strip_prefix("data:")
                    .map(str::trim)
                    .filter(|d| d.starts_with('{'))
            })
            .unwrap_or(body.trim());
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {body}"))
    };
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/list"});
    let (_, _, body) = post(&served.url, &session, list).await;
    let r = answer(body);
    assert_eq!(r["result"]["tasks"], json!([]), "{r}");
    let result =
        json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/result", "params": {"taskId": id}});
    let (_, _, body) = post(&served.url, &session, result).await;
    let r = answer(body);
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let t = alice
            .peer()
            .get_task(GetTaskParams::new(id.clone()))
            .await
            .expect("alice polls her task")
            .task;
        if t.status().is_terminal() {
            assert!(format!("{t:?}").contains("done"), "{t:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the task did not end: {t:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The 2025-11-25 form of tasks over HTTP, through the official TypeScript SDK's tasks API:
/// the same client and checks as over stdio (`common::sdk_tasks`), in an MCP session.
#[tokio::test(flavor = "multi_thread")]
async fn the_typescript_sdk_runs_a_task_over_http() {
    let (home, tokens) = token_home();
    let served = Served::start(home, &[("MCP_BRIDGE_TOKEN_FILE", &tokens)], &[]);
    let mut env = served.home.env();
    env.push(("MCP_TOKEN".into(), ALICE.into()));
    common::sdk_tasks::check(&served.url, env, served.home.path()).await;
}

/// HTTPS from certificate files: a client that trusts the certificate calls `run_python`; plain
/// HTTP to the same port gets no MCP answer.
#[tokio::test(flavor = "multi_thread")]
async fn tls_from_certificate_and_key_files() {
    use rmcp::ServiceExt as _;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let (home, tokens) = token_home();
    let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let cert_pem = key.cert.pem();
    let cert = home.path().join("cert.pem");
    let private = home.path().join("key.pem");
    std::fs::write(&cert, &cert_pem).unwrap();
    std::fs::write(&private, key.signing_key.serialize_pem()).unwrap();
    let served = Served::start(
        home,
        &[
            ("MCP_BRIDGE_TOKEN_FILE", &tokens),
            ("MCP_BRIDGE_HTTP_TLS_CERT", &cert.display().to_string()),
            ("MCP_BRIDGE_HTTP_TLS_KEY", &private.display().to_string()),
        ],
        &[],
    );
    assert!(
        served.url.starts_with("https://127.0.0.1:"),
        "{}",
        served.url
    );
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cert_pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    let transport = StreamableHttpClientTransport::with_client(
        http,
        StreamableHttpClientTransportConfig::with_uri(served.url.as_str()).auth_header(ALICE),
    );
    let client = ().serve(transport).await.expect("initialize over HTTPS");
    let out = run(&client, json!({"code": "print(6 * 7)"})).await.ok();
    assert_eq!(out.stdout().trim(), "42");
    let plain = served.url.replacen("https://", "http://", 1);
    let r = reqwest::Client::new().post(&plain).body("{}").send().await;
    assert!(
        r.as_ref().map_or(true, |r| !r.status().is_success()),
        "plain HTTP was answered: {r:?}"
    );
}

/// SIGTERM with a call in flight: the call gets its result, `serve` exits 0, no container is
/// left; a new connection meanwhile is refused.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_the_call_in_flight_finish() {
    let (home, tokens) = token_home();
    let mut served = Served::start(home, &[("MCP_BRIDGE_TOKEN_FILE", &tokens)], &[]);
    let alice = served.client(Some(ALICE)).await;
    run(&alice, json!({"code": "pass"})).await.ok();
    let peer = alice.peer().clone();
    let call = tokio::spawn(async move {
        let params = CallToolRequestParams::new("run_python").with_arguments(
            json!({"code": "import time; time.sleep(4); print('finished')"})
                .as_object()
                .cloned()
                .unwrap(),
        );
        peer.call_tool(params).await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    unsafe { libc::kill(served.pid as i32, libc::SIGTERM) };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let late = reqwest::Client::new()
        .post(&served.url)
        .header("authorization", format!("Bearer {BOB}"))
        .body(initialize().to_string())
        .send()
        .await;
    assert!(
        late.is_err(),
        "a new connection was served after SIGTERM: {late:?}"
    );
    let result = call
        .await
        .unwrap()
        .expect("the call in flight was answered");
    assert_eq!(
        common::Outcome(result.clone()).sc()["stdout"],
        "finished\n",
        "{result:?}"
    );
    let status = served
        .terminate(Duration::from_secs(60))
        .expect("serve exits after the call");
    assert!(status.success(), "{status:?}\n{}", served.home.log());
    let left = common::wait_no_containers(served.pid, Duration::from_secs(20)).await;
    assert!(left.is_empty(), "containers left after SIGTERM: {left:?}");
}

/// The request bounds that need no sandbox: a body over `http.max_request_size` is 413 (with or
/// without an MCP session), and a third SSE stream of one MCP session is 429 while two are open.
#[tokio::test(flavor = "multi_thread")]
async fn oversized_bodies_and_extra_sse_streams_are_refused() {
    let (home, tokens) = token_home();
    let served = Served::start(
        home,
        &[
            ("MCP_BRIDGE_TOKEN_FILE", &tokens),
            ("MCP_BRIDGE_HTTP_MAX_REQUEST_SIZE", "64k"),
            ("MCP_BRIDGE_WARM_START", "false"),
            ("MCP_BRIDGE_POOL_SIZE", "0"),
        ],
        &[],
    );
    let bearer = format!("Bearer {ALICE}");
    let big = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "run_python", "arguments": {"code": "x".repeat(100 << 10)}}});
    let (status, _, body) = post(&served.url, &[("authorization", &bearer)], big.clone()).await;
    assert_eq!(status, 413, "{body}");

    let sid = open_session(&served.url, &bearer).await;
    let session = [
        ("authorization", bearer.as_str()),
        ("mcp-session-id", sid.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    post(
        &served.url,
        &session,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let (status, _, body) = post(&served.url, &session, big).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("http.max_request_size"), "{body}");

    let get = || {
        let mut req = reqwest::Client::new()
            .get(&served.url)
            .header("accept", "text/event-stream");
        for (k, v) in session {
            req = req.header(k, v);
        }
        req.send()
    };
    let first = get().await.unwrap();
    assert_eq!(first.status(), 200);
    let second = get().await.unwrap();
    assert_eq!(second.status(), 200);
    let third = get().await.unwrap();
    assert_eq!(third.status(), 429);
    // One closed, one may open again.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let again = get().await.unwrap();
        if again.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a stream closed, yet another is still refused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(second);
}

/// The headers and `_meta` of a raw 2026-07-28 request (no session: it stands alone).
fn modern(method: &str, name: Option<&str>) -> Vec<(&'static str, String)> {
    let mut h = vec![
        ("mcp-protocol-version", "2026-07-28".to_string()),
        ("mcp-method", method.to_string()),
    ];
    if let Some(n) = name {
        h.push(("mcp-name", n.to_string()));
    }
    h
}

fn modern_meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}})
}

/// The JSON-RPC answer in a body that is JSON or an SSE stream.
fn answer(body: &str) -> Value {
    let json = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:").map(str::trim))
        .find(|d| d.starts_with('{') && d.contains("\"id\""))
        .unwrap_or(body.trim());
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Two MCP sessions (2025-11-25) of one token do not share an interpreter unless they name one:
/// each has its own default, which every result names (the `session` of its `_meta`), and
/// naming it reaches it. A 2026-07-28 request, which has no connection, gets `default`. A
/// session's DELETE is answered 204 (the Python SDK warns about a 202 on every close).
#[tokio::test(flavor = "multi_thread")]
async fn each_mcp_session_has_its_own_default_interpreter() {
    let (home, tokens) = token_home();
    let served = Served::start(
        home,
        &[
            ("MCP_BRIDGE_TOKEN_FILE", &tokens),
            ("MCP_BRIDGE_POOL_SIZE", "0"),
        ],
        &[],
    );
    let bearer = format!("Bearer {ALICE}");
    let call = |id: u32, args: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "run_python", "arguments": args}})
    };
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let sid = open_session(&served.url, &bearer).await;
        let headers = vec![
            ("authorization", bearer.clone()),
            ("mcp-session-id", sid),
            ("mcp-protocol-version", "2025-11-25".to_string()),
        ];
        let refs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        post(
            &served.url,
            &refs,
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await;
        sessions.push(headers);
    }
    let in_session = |i: usize, args: Value| {
        let url = served.url.clone();
        let headers = sessions[i].clone();
        async move {
            let refs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (status, _, body) = post(&url, &refs, call(7, args)).await;
            assert_eq!(status, 200, "{body}");
            common::structured(&answer(&body)["result"])
        }
    };
    let first = in_session(0, json!({"code": "x = 'first'"})).await;
    let mine = first["session"]
        .as_str()
        .expect("the result names its session")
        .to_string();
    assert!(mine.starts_with("mcp-"), "{first}");
    let second = in_session(1, json!({"code": "print(globals().get('x'))"})).await;
    assert_eq!(
        second["stdout"], "None\n",
        "the two MCP sessions share an interpreter: {second}"
    );
    assert_ne!(second["session"], first["session"], "{second}");
    // Named, the first one's interpreter is reachable from the second.
    let named = in_session(1, json!({"code": "print(x)", "session": mine})).await;
    assert_eq!(named["stdout"], "first\n", "{named}");
    assert_eq!(named["session"], mine.as_str());

    // 2026-07-28: no connection, so the identity's `default`, and the result says so.
    let mut h = modern("tools/call", Some("run_python"));
    h.push(("authorization", bearer.clone()));
    let refs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut body = call(8, json!({"code": "print(1)"}));
    body["params"]["_meta"] = modern_meta();
    let (status, _, text) = post(&served.url, &refs, body).await;
    assert_eq!(status, 200, "{text}");
    let r = answer(&text);
    assert_eq!(
        common::structured(&r["result"])["session"],
        "default",
        "{r}"
    );

    // Closing an MCP session: 204, and it is gone.
    let close = reqwest::Client::new()
        .delete(&served.url)
        .header("authorization", &bearer)
        .header("mcp-session-id", &sessions[0][1].1)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(close.status().as_u16(), 204);
}

/// A 2026-07-28 client cancels by closing its request's connection: the call is cancelled, and
/// the bridge's log has no ERROR for the answer that had nowhere to go.
#[tokio::test(flavor = "multi_thread")]
async fn a_2026_07_28_client_that_leaves_leaves_no_error_in_the_log() {
    let served = Served::start(Home::new(), &[("MCP_BRIDGE_POOL_SIZE", "0")], &[]);
    // The session's sandbox is started first, so the call below is sleeping when it is left.
    let client = served.client(None).await;
    run(&client, json!({"code": "1", "session": "left"}))
        .await
        .ok();
    let h = modern("tools/call", Some("run_python"));
    let mut body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "run_python", "arguments": {"code": "import time\ntime.sleep(30)", "session": "left"}}});
    body["params"]["_meta"] = modern_meta();
    let url = served.url.clone();
    let call = tokio::spawn(async move {
        let refs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        post(&url, &refs, body).await
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    call.abort();
    let _ = call.await;
    // The next call of the session runs at once: the abandoned one was cancelled.
    let started = Instant::now();
    run(&client, json!({"code": "print('next')", "session": "left"}))
        .await
        .ok();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the abandoned call ran on: {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = served.home.log();
    assert!(
        !log.lines().any(|l| l.contains("ERROR")),
        "an ERROR line for a client that left:\n{log}"
    );
}

/// Connections need no token, so what they hold is bounded before any request. A slowloris
/// (three times `http.max_connections` connections that never finish their headers, half of
/// them sending nothing) does not lock a client out: each new connection takes the place of
/// the oldest one still pending, so a real client that sends a whole request is served at once
/// while the open files stay within the cap. Only when every place is held by a connection
/// that sent a whole request is the next answered 503 (with `Retry-After`) and closed, and a
/// real client then gets that answer at once rather than a timeout. Connections that never
/// finish their headers are closed after `http.header_timeout`. `serve` started with systemd's
/// small soft limit of open files raises it to the hard one.
#[tokio::test(flavor = "multi_thread")]
async fn connections_are_capped_and_a_slowloris_cannot_lock_clients_out() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const CAP: usize = 32;
    let served = Served::start_with_open_files(
        Home::new(),
        &[
            ("MCP_BRIDGE_HTTP_MAX_CONNECTIONS", "32"),
            ("MCP_BRIDGE_HTTP_HEADER_TIMEOUT", "5s"),
            ("MCP_BRIDGE_WARM_START", "false"),
            ("MCP_BRIDGE_POOL_SIZE", "0"),
        ],
        &[],
        Some(256),
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", served.pid)).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        f[3], f[4],
        "the soft limit was not raised to the hard one: {line}"
    );
    assert!(
        served
            .home
            .log()
            .contains("raised the open-files limit from 256"),
        "{}",
        served.home.log()
    );

    let addr = served.base().trim_start_matches("http://").to_string();
    let open_files = || {
        std::fs::read_dir(format!("/proc/{}/fd", served.pid))
            .unwrap()
            .count()
    };
    let before = open_files();

    // The slowloris: 96 connections, each pending (a partial request, or nothing).
    let mut held = Vec::new();
    for i in 0..3 * CAP {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        if i % 2 == 0 {
            s.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
                .await
                .unwrap();
        }
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        open_files() <= before + CAP + 4,
        "{} open files with {} pending connections (before: {before}, cap {CAP})",
        open_files(),
        3 * CAP
    );
    // A real client, twice, while the attacker keeps reopening.
    for round in 0..2 {
        let asked = Instant::now();
        let (status, _, body) = post(&served.url, &[], initialize()).await;
        assert_eq!(status, 200, "round {round}: {body}\n{}", served.home.log());
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "round {round}: {:?}",
            asked.elapsed()
        );
        for _ in 0..CAP {
            held.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
        }
    }
    assert!(
        served
            .home
            .log()
            .contains("closed the oldest connection that had not sent a whole request"),
        "{}",
        served.home.log()
    );
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(3);
    while open_files() > before + 2 {
        assert!(
            Instant::now() < deadline,
            "{} open files after the slowloris left (before: {before})",
            open_files()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every place held by a connection that sent a whole request (and keeps it open): the next
    // is refused with a clear answer.
    let started = Instant::now();
    let mut busy = Vec::new();
    for _ in 0..CAP {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("an answer to a whole request")
            .unwrap();
        assert!(
            n > 0 && buf.starts_with(b"HTTP/1.1 "),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        busy.push(s);
    }
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("a refusal, not a wait")
        .unwrap();
    let r = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert!(r.contains("Retry-After: 1"), "{r}");
    assert!(r.contains("http.max_connections"), "{r}");
    let asked = Instant::now();
    let (status, h, body) = post(&served.url, &[], initialize()).await;
    assert_eq!(status, 503, "{body}");
    assert!(h.contains_key("retry-after"), "{h:?}");
    assert!(body.contains("http.max_connections"), "{body}");
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );

    // After the header timeout (5 s), the server has closed every idle one of them.
    tokio::time::sleep(Duration::from_secs(7).saturating_sub(started.elapsed())).await;
    for s in &mut busy {
        let mut buf = [0u8; 512];
        let r = tokio::time::timeout(Duration::from_millis(50), s.read(&mut buf)).await;
        assert!(r.is_ok(), "an idle connection is still open after 7 s");
    }
    drop(busy);
    let deadline = Instant::now() + Duration::from_secs(3);
    while open_files() > before + 2 {
        assert!(
            Instant::now() < deadline,
            "{} open files after the connections were closed (before: {before})",
            open_files()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = served.client(None).await;
    client.list_tools(None).await.expect("tools/list");
    client.cancel().await.unwrap();
}

/// One identity's MCP sessions are bounded (`http.max_mcp_sessions_per_identity`): the next
/// `initialize` is 429 naming the key and leaves no session behind; another identity opens
/// one still, and a session closed with DELETE makes room again.
#[tokio::test(flavor = "multi_thread")]
async fn one_identitys_mcp_sessions_are_bounded() {
    let (home, tokens) = token_home();
    let served = Served::start(
        home,
        &[
            ("MCP_BRIDGE_TOKEN_FILE", &tokens),
            ("MCP_BRIDGE_HTTP_MAX_MCP_SESSIONS_PER_IDENTITY", "3"),
            ("MCP_BRIDGE_WARM_START", "false"),
            ("MCP_BRIDGE_POOL_SIZE", "0"),
        ],
        &[],
    );
    let alice = format!("Bearer {ALICE}");
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(open_session(&served.url, &alice).await);
    }
    for _ in 0..5 {
        let (status, h, body) = post(&served.url, &[("authorization", &alice)], initialize()).await;
        assert_eq!(status, 429, "{body}");
        assert!(
            body.contains("http.max_mcp_sessions_per_identity"),
            "{body}"
        );
        assert!(!h.contains_key("mcp-session-id"), "{h:?}");
    }
    open_session(&served.url, &format!("Bearer {BOB}")).await;
    let deleted = reqwest::Client::new()
        .delete(&served.url)
        .header("authorization", &alice)
        .header("mcp-session-id", &ids[0])
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{deleted:?}");
    open_session(&served.url, &alice).await;
    let (status, _, body) = post(&served.url, &[("authorization", &alice)], initialize()).await;
    assert_eq!(status, 429, "{body}");
}

/// Tasks are answered at once and then wait for their session, so what they hold is bounded:
/// past 8 MiB of code, or 8 tasks, not yet ended on one session, `tools/call` is refused with a
/// message naming the bound and what to do; a task that ends makes room.
#[tokio::test(flavor = "multi_thread")]
async fn one_sessions_queued_tasks_are_bounded_in_count_and_bytes() {
    use rmcp::ServiceExt as _;
    use rmcp::model::{
        CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig, GetTaskParams,
        Implementation, RequestMetaObject,
    };
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let (home, tokens) = token_home();
    let mut served = Served::start(home, &[("MCP_BRIDGE_TOKEN_FILE", &tokens)], &[]);
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(served.url.as_str()).auth_header(ALICE),
    );
    let alice = ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("queued-tasks", "1"),
    )
    .serve(transport)
    .await
    .expect("initialize over HTTP");
    let start = |code: String| {
        let mut params = CallToolRequestParams::new("run_python")
            .with_arguments(json!({"code": code}).as_object().cloned().unwrap());
        let mut meta = RequestMetaObject::new();
        meta.set_client_capabilities(ClientCapabilities::builder().enable_tasks().build());
        params.meta = Some(meta);
        let peer = alice.peer().clone();
        async move {
            match peer.call_tool_once(params).await {
                Ok(CallToolResponse::Task(t)) => Ok(t.task.task_id),
                Ok(other) => panic!("expected a task, got {other:?}"),
                Err(e) => Err(format!("{e:?}")),
            }
        }
    };
    let mut ids = vec![
        start("import time; time.sleep(60)".into())
            .await
            .expect("the first task"),
    ];
    let big = format!("x = 1\n#{}\n", "x".repeat(3 << 20));
    for _ in 0..2 {
        ids.push(start(big.clone()).await.expect("6 MiB of code queued"));
    }
    let why = start(big.clone()).await.expect_err("past 8 MiB of code");
    assert!(why.contains("holding 6.0 MiB of code"), "{why}");
    assert!(why.contains("tasks/cancel"), "{why}");
    for i in 0..5 {
        ids.push(start(format!("print({i})")).await.expect("8 tasks queued"));
    }
    let why = start("print('ninth')".into())
        .await
        .expect_err("a ninth task");
    assert!(why.contains("has 8 tasks not yet ended"), "{why}");

    alice
        .peer()
        .cancel_task(CancelTaskParams::new(ids[0].clone()))
        .await
        .expect("tasks/cancel");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !alice
        .peer()
        .get_task(GetTaskParams::new(ids[0].clone()))
        .await
        .expect("tasks/get")
        .task
        .status()
        .is_terminal()
    {
        assert!(Instant::now() < deadline, "the cancelled task did not end");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    start("print('room again')".into())
        .await
        .expect("a task that ended makes room");
    assert!(served.terminate(Duration::from_secs(120)).is_some());
}
