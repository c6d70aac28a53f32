//! `serve`: the bridge over MCP's Streamable HTTP, for a team or a remote client. rmcp's
//! `StreamableHttpService` speaks the protocol at `/mcp` (2026-07-28 stateless requests, and
//! `Mcp-Session-Id` sessions for older revisions); around it, in this order:
//!
//! 1. [`guard::check_host_and_origin`]: DNS-rebinding protection, before anything else, so a
//!    page on a foreign origin learns nothing, not even whether authentication is on;
//! 2. [`auth`]: who the request is (bearer token of `token_file`, or OAuth access token), put in
//!    its extensions as an [`Identity`] for the handler, which keys sessions, skills, files,
//!    tasks and audit records by it;
//! 3. [`guard::Limits`]: an `Mcp-Session-Id` is only its creator's, requests of one identity in
//!    flight and SSE streams of one MCP session are bounded.
//!
//! The Protected Resource Metadata (RFC 9728) is served at
//! `/.well-known/oauth-protected-resource[/mcp]` when OAuth is on.
//!
//! **Architecture invariant:** this module knows nothing of sandboxes or upstream servers; it
//! hands requests to the [`Bridge`] with an identity and leaves the rest to it.

pub mod auth;
mod conn;
mod guard;
mod legacy;
mod problem;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use serde_json::json;

use auth::Auth;
use bridge_core::config::{Config, http::parse_listen};
use bridge_core::error::{Hint, Hinted};
use bridge_core::identity::Identity;
use bridge_server::Bridge;
use problem::problem;

/// Where the MCP endpoint is.
pub const MCP_PATH: &str = "/mcp";
/// The Protected Resource Metadata of `/mcp` (RFC 9728 §3.1: the resource's path appended).
pub const PRM_PATH: &str = "/.well-known/oauth-protected-resource/mcp";
/// How long in-flight calls get to finish after SIGTERM, beyond the longest call.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why `serve` cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// `listen` is not a loopback address and neither `token_file` nor `[oauth]` is set; the
    /// field is the address.
    #[error(
        "refusing to listen on {0} without authentication: anyone who can reach it could run code"
    )]
    Unauthenticated(SocketAddr),
    /// The listening socket could not be bound (the port is taken, or not ours to take).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address of `listen`.
        addr: SocketAddr,
        /// Why the bind failed.
        source: std::io::Error,
    },
    /// `http.tls_cert` or `http.tls_key` could not be read or is not PEM.
    #[error("cannot read the TLS certificate or key: {0}")]
    Tls(std::io::Error),
    /// Authentication could not be set up: `token_file` or `oauth.issuer`.
    #[error(transparent)]
    Auth(#[from] auth::AuthSetupError),
    /// `listen` is not an address to listen on.
    #[error("{0}")]
    Listen(bridge_core::config::InvalidValue),
}

impl Hinted for ServeError {
    fn hint(&self) -> Option<Hint> {
        Some(match self {
            ServeError::Unauthenticated(_) => Hint::clause(
                "set token_file (lines of `name:token`) or oauth.issuer and oauth.audience, or listen on 127.0.0.1",
            ),
            ServeError::Bind { .. } => Hint::clause(
                "choose another port with --listen (or MCP_BRIDGE_LISTEN), or stop what uses it",
            ),
            ServeError::Tls(_) => Hint::clause(
                "http.tls_cert must be a PEM certificate chain and http.tls_key its PEM private key (PKCS#8, PKCS#1 or SEC1)",
            ),
            ServeError::Auth(e) => return e.hint(),
            ServeError::Listen(_) => {
                Hint::clause("write listen as address:port, like 127.0.0.1:8931")
            }
        })
    }
}

/// The MCP endpoint itself, for the notifications the bridge sends on a client's behalf.
type Mcp = StreamableHttpService<Bridge, LocalSessionManager>;

/// What every request's middleware shares.
struct Shared {
    mcp: Mcp,
    max_body: usize,
    auth: Option<Auth>,
    guard: Arc<guard::Limits>,
    hosts: guard::Hosts,
    tls: bool,
}

/// Serve `bridge` over HTTP until SIGTERM or SIGINT; then let the calls in flight finish (up to
/// `max_timeout` and a grace), close the MCP sessions and remove every container.
pub async fn serve(bridge: Bridge, config: Arc<Config>) -> Result<(), ServeError> {
    let addr = parse_listen(&config.listen).map_err(ServeError::Listen)?;
    let auth = Auth::from_config(&config).await?;
    if auth.is_none() && !addr.ip().is_loopback() {
        return Err(ServeError::Unauthenticated(addr));
    }
    let tls = match (&config.http.tls_cert, &config.http.tls_key) {
        (Some(cert), Some(key)) => {
            // The one crypto provider of this process (jsonwebtoken and reqwest use aws-lc-rs too).
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
            Some(
                axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
                    .await
                    .map_err(ServeError::Tls)?,
            )
        }
        _ => None,
    };
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    let capped = conn::Capped::new(
        conn::connection_cap(config.http.max_connections, conn::raise_open_files()),
        config.http.header_timeout.0,
        tls.is_none(),
    );

    let stop = tokio_util::sync::CancellationToken::new();
    let mcp_config = StreamableHttpServerConfig::default()
        .with_cancellation_token(stop.child_token())
        .with_max_request_body_bytes(config.http.max_request_size.0 as usize)
        // Host and Origin are checked by `guard` before authentication (its order matters:
        // see the module doc); rmcp's own checks would see the same lists.
        .disable_allowed_hosts()
        .disable_allowed_origins();
    let for_sessions = bridge.clone();
    let sessions = Arc::new(LocalSessionManager::default());
    let mcp = StreamableHttpService::new(
        move || Ok(for_sessions.for_connection()),
        sessions.clone(),
        mcp_config,
    );
    let shared = Arc::new(Shared {
        mcp: mcp.clone(),
        max_body: config.http.max_request_size.0 as usize,
        hosts: guard::Hosts::new(&config.http, bound),
        guard: guard::Limits::new(
            config.http.max_requests_per_identity as usize,
            config.http.max_mcp_sessions_per_identity as usize,
            sessions,
        ),
        auth,
        tls: tls.is_some(),
    });
    let app = axum::Router::new()
        .route_service(MCP_PATH, mcp)
        .route(PRM_PATH, axum::routing::get(protected_resource_metadata))
        .route(
            "/.well-known/oauth-protected-resource",
            axum::routing::get(protected_resource_metadata),
        )
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(shared.clone(), authenticate))
        .layer(middleware::from_fn_with_state(
            shared.clone(),
            check_host_and_origin,
        ))
        .with_state(shared.clone());

    let scheme = if tls.is_some() { "https" } else { "http" };
    match &shared.auth {
        Some(a) => tracing::info!(
            "serving MCP at {scheme}://{bound}{MCP_PATH}; accepting {}",
            a.describe()
        ),
        None => tracing::info!(
            "serving MCP at {scheme}://{bound}{MCP_PATH} without authentication (loopback only)"
        ),
    }

    let handle = axum_server::Handle::new();
    let service = app.into_make_service();
    let header_timeout = config.http.header_timeout.0;
    let server = {
        let handle = handle.clone();
        async move {
            match tls {
                Some(tls) => {
                    let mut server = axum_server::from_tcp_rustls(listener, tls)?
                        .map(|tls| tls.acceptor(capped));
                    conn::deadlines(server.http_builder(), header_timeout);
                    server.handle(handle).serve(service).await
                }
                None => {
                    let mut server = axum_server::from_tcp(listener)?.acceptor(capped);
                    conn::deadlines(server.http_builder(), header_timeout);
                    server.handle(handle).serve(service).await
                }
            }
        }
    };
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => {
            if let Err(e) = r { tracing::error!("the HTTP server stopped: {e}"); }
        }
        sig = bridge_server::quit_signal() => {
            let deadline = config.max_timeout.0 + SHUTDOWN_GRACE;
            tracing::info!(
                in_flight = shared.guard.in_flight(),
                "{sig}: no new connections; calls in flight get up to {}s",
                deadline.as_secs()
            );
            handle.graceful_shutdown(Some(deadline));
            // Calls end on their own (each is bounded by its timeout); open SSE streams would
            // not, so the MCP sessions are closed once no call is left.
            let _ = tokio::time::timeout(deadline, shared.guard.idle()).await;
            stop.cancel();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await;
        }
    }
    bridge.shutdown().await;
    Ok(())
}

/// The scheme and authority clients used for this request: `http.public_url`'s, else the
/// request's `Host`.
fn base_url(shared: &Shared, headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let scheme = if shared.tls { "https" } else { "http" };
    format!("{scheme}://{host}")
}

/// RFC 9728 metadata: where this resource's tokens come from. 404 when OAuth is off.
async fn protected_resource_metadata(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Response {
    let issuers = shared
        .auth
        .as_ref()
        .map(Auth::oauth_issuers)
        .unwrap_or_default();
    if issuers.is_empty() {
        return not_found().await;
    }
    let resource = shared
        .auth
        .as_ref()
        .map(|a| a.resource(format!("{}{MCP_PATH}", base_url(&shared, &headers))))
        .unwrap_or_default();
    axum::Json(json!({
        "resource": resource,
        "authorization_servers": issuers,
        "bearer_methods_supported": ["header"],
        "resource_name": "mcp-code-bridge",
    }))
    .into_response()
}

async fn not_found() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("nothing here; MCP is served at {MCP_PATH}"),
    )
}

async fn check_host_and_origin(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(why) = shared.hosts.check(&request) {
        tracing::info!("refused a request: {why}");
        return problem(StatusCode::FORBIDDEN, "forbidden", why.to_string());
    }
    next.run(request).await
}

async fn authenticate(
    State(shared): State<Arc<Shared>>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if path != MCP_PATH {
        return next.run(request).await;
    }
    // Without authentication (loopback only) there is one user, as over stdio: no identity,
    // and its sessions and skills are that user's own. The bounds still count its requests.
    let identity = match &shared.auth {
        None => Identity::Local,
        Some(auth) => {
            let header = request
                .headers()
                .get(header::AUTHORIZATION)
                .map(HeaderValue::as_bytes);
            match auth.check(header).await {
                Ok(id) => Identity::Named(id),
                Err(refusal) => return unauthorized(&shared, request.headers(), refusal),
            }
        }
    };
    request.extensions_mut().insert(identity.clone());
    let delete = request.method() == axum::http::Method::DELETE;
    let (request, wire, message) = match legacy::inbound(request, shared.max_body).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    let abandoned = cancel_on_disconnect(&shared, request.headers(), message.as_ref());
    let mut response = shared.guard.run(identity, request, next, abandoned).await;
    // rmcp answers a session's DELETE with 202 Accepted, though the session is closed by then;
    // the Python SDK warns on anything but 200 or 204 ("Session termination failed").
    if delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    match wire {
        Some(wire) => legacy::outbound(response, wire).await,
        None => response,
    }
}

/// For a `tools/call` of an MCP session (2025-11-25 and older): what cancels it when its client
/// goes away before the answer. rmcp does so itself for requests without a session; a session's
/// request would run on to its timeout, holding its interpreter. The bridge sends
/// `notifications/cancelled` for it into the session, as the client would have. `message` is
/// the POST's body as `legacy::inbound` read it (`None` for anything but a JSON POST).
fn cancel_on_disconnect(
    shared: &Arc<Shared>,
    request_headers: &HeaderMap,
    message: Option<&serde_json::Value>,
) -> Option<guard::OnAbandoned> {
    if !request_headers.contains_key("mcp-session-id") {
        return None;
    }
    let id = message
        .filter(|v| v.get("method").and_then(|m| m.as_str()) == Some("tools/call"))
        .and_then(|v| v.get("id").cloned());
    id.map(|id| {
        let mut headers = HeaderMap::new();
        for name in ["mcp-session-id", "mcp-protocol-version", "host"] {
            if let Some(v) = request_headers.get(name) {
                headers.insert(name, v.clone());
            }
        }
        let mcp = shared.mcp.clone();
        Box::new(move || {
            tokio::spawn(async move {
                use tower_service::Service as _;
                let body = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": {"requestId": id, "reason": "the client disconnected"}});
                let mut req = axum::http::Request::post(MCP_PATH)
                    .header(header::CONTENT_TYPE, "application/json")
                    .header(header::ACCEPT, "application/json, text/event-stream")
                    .body(axum::body::Body::from(body.to_string()))
                    .expect("a valid request");
                req.headers_mut().extend(headers);
                let mut mcp = mcp;
                let _ = mcp.call(req).await;
                tracing::info!(
                    "a client disconnected before its tools/call was answered: cancelled it"
                );
            });
        }) as guard::OnAbandoned
    })
}

/// 401 with the challenge of RFC 6750 §3, and the metadata's URL when OAuth is on (MCP
/// authorization spec: clients find the authorization server from it).
fn unauthorized(shared: &Shared, headers: &HeaderMap, refusal: auth::Refusal) -> Response {
    let mut challenge = String::from("Bearer realm=\"mcp-code-bridge\"");
    if shared.auth.as_ref().and_then(Auth::oauth_issuer).is_some() {
        challenge.push_str(&format!(
            ", resource_metadata=\"{}{PRM_PATH}\"",
            base_url(shared, headers)
        ));
    }
    if let Some(e) = refusal.error {
        let quoted = refusal.description.replace(['"', '\\'], "'");
        challenge.push_str(&format!(", error=\"{e}\", error_description=\"{quoted}\""));
    }
    tracing::info!("refused a request: {}", refusal.description);
    let mut r = problem(
        StatusCode::UNAUTHORIZED,
        refusal.error.unwrap_or("unauthorized"),
        refusal.description,
    );
    if let Ok(v) = HeaderValue::from_str(&challenge) {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    r
}
