//! The checks of `serve` that are not authentication: `Host` and `Origin` against the allow
//! lists (DNS-rebinding protection), an `Mcp-Session-Id` kept to the identity that created it,
//! and the bounds on what one identity holds at once.

use bridge_core::identity::Identity;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use tokio::sync::{Notify, Semaphore};

use bridge_core::config::HttpConfig;

/// Most SSE streams (GETs) one MCP session keeps open at once.
pub(super) const SSE_STREAMS_PER_SESSION: usize = 2;
/// Most `Mcp-Session-Id`s remembered with their identity; the oldest are forgotten first
/// (rmcp has closed them long before: a session lives while its client uses it).
const MAX_OWNED_SESSIONS: usize = 10_000;
const SESSION_HEADER: &str = "mcp-session-id";

/// The names a request's `Host` may carry, and the `Origin`s a browser request may come from.
pub(super) struct Hosts {
    any_host: bool,
    hosts: Vec<String>,
    origins: Vec<OriginRule>,
}

/// One `http.allowed_origins` entry: scheme, host, and a port (`None`: any, written `:*`; an
/// entry without one means the scheme's default).
#[derive(Debug)]
struct OriginRule {
    scheme: String,
    host: String,
    port: Option<u16>,
}

const LOOPBACK: [&str; 4] = ["localhost", "127.0.0.1", "::1", "[::1]"];

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" { 443 } else { 80 }
}

/// Why a request was refused before authentication (its Host or Origin): the 403's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum GuardRefusal {
    /// The request names no host, neither in `Host` nor in its URI.
    #[error("the request has no Host")]
    NoHost,
    /// The host (lower case) is not in the allow list.
    #[error(
        "Host {0:?} is not one this server answers to (DNS-rebinding protection); add it to http.allowed_hosts (MCP_BRIDGE_HTTP_ALLOWED_HOSTS)"
    )]
    Host(String),
    /// The `Origin` (trimmed, lower case) is not in the allow list.
    #[error(
        "Origin {0:?} is not allowed (DNS-rebinding protection); add it to http.allowed_origins (MCP_BRIDGE_HTTP_ALLOWED_ORIGINS) if this page should reach the bridge"
    )]
    Origin(String),
}

impl OriginRule {
    fn parse(entry: &str) -> Option<OriginRule> {
        let (scheme, rest) = entry.split_once("://")?;
        let rest = rest.trim_end_matches('/');
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, "*")) => (h, None),
            Some((h, p)) if !h.ends_with(':') && p.chars().all(|c| c.is_ascii_digit()) => {
                (h, Some(p.parse().ok()?))
            }
            // No port: the scheme's own, as the browser sends it.
            _ => (rest, Some(default_port(&scheme.to_ascii_lowercase()))),
        };
        Some(OriginRule {
            scheme: scheme.to_ascii_lowercase(),
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

impl Hosts {
    pub(super) fn new(config: &HttpConfig, bound: SocketAddr) -> Hosts {
        let mut hosts: Vec<String> = LOOPBACK.iter().map(|s| s.to_string()).collect();
        if !bound.ip().is_unspecified() {
            hosts.push(match bound {
                SocketAddr::V4(a) => a.ip().to_string(),
                SocketAddr::V6(a) => format!("[{}]", a.ip()),
            });
        }
        hosts.extend(
            config
                .allowed_hosts
                .0
                .iter()
                .map(|h| h.to_ascii_lowercase()),
        );
        let mut origins: Vec<OriginRule> = ["http", "https"]
            .iter()
            .flat_map(|s| {
                ["localhost", "127.0.0.1", "[::1]"].map(|h| OriginRule {
                    scheme: s.to_string(),
                    host: h.into(),
                    port: None,
                })
            })
            .collect();
        origins.extend(config.allowed_origins.0.iter().filter_map(|o| {
            if o == "null" {
                Some(OriginRule {
                    scheme: "null".into(),
                    host: String::new(),
                    port: None,
                })
            } else {
                OriginRule::parse(o)
            }
        }));
        Hosts {
            any_host: config.allowed_hosts.0.iter().any(|h| h == "*"),
            hosts,
            origins,
        }
    }

    /// `Err`: why the request is refused (403).
    pub(super) fn check(&self, request: &Request) -> Result<(), GuardRefusal> {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string)
            .or_else(|| request.uri().authority().map(|a| a.to_string()));
        if !self.any_host {
            let Some(host) = host else {
                return Err(GuardRefusal::NoHost);
            };
            let host = host.to_ascii_lowercase();
            let name = match host.rsplit_once(':') {
                Some((n, p))
                    if !n.is_empty()
                        && p.chars().all(|c| c.is_ascii_digit())
                        && (n.starts_with('[') || !n.contains(':')) =>
                {
                    n
                }
                _ => host.as_str(),
            };
            if !self.hosts.iter().any(|h| h == &host || h == name) {
                return Err(GuardRefusal::Host(host));
            }
        }
        if let Some(origin) = request.headers().get(header::ORIGIN) {
            let o = origin.to_str().unwrap_or("").trim().to_ascii_lowercase();
            if !self.origin_allowed(&o) {
                return Err(GuardRefusal::Origin(o));
            }
        }
        Ok(())
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        if origin == "null" {
            return self.origins.iter().any(|r| r.scheme == "null");
        }
        let Ok(url) = url::Url::parse(origin) else {
            return false;
        };
        let Some(host) = url.host_str() else {
            return false;
        };
        let port = url.port().unwrap_or(default_port(url.scheme()));
        self.origins
            .iter()
            .any(|r| r.scheme == url.scheme() && r.host == host && r.port.is_none_or(|p| p == port))
    }
}

/// What one identity and one MCP session hold, and the requests in flight (for shutdown).
pub(super) struct Limits {
    per_identity: usize,
    /// `http.max_mcp_sessions_per_identity`.
    mcp_sessions_per_identity: usize,
    /// rmcp's sessions, to tell which of an identity's are still open.
    sessions: Arc<LocalSessionManager>,
    slots: Mutex<HashMap<Identity, Arc<Semaphore>>>,
    owners: Mutex<(HashMap<String, Identity>, VecDeque<String>)>,
    streams: Mutex<HashMap<String, usize>>,
    in_flight: Arc<(AtomicUsize, Notify)>,
}

/// What to do when a response's client goes away before its end (see [`Limits::run`]).
pub(super) type OnAbandoned = Box<dyn FnOnce() + Send + Sync>;

/// Released when the response's body ends (or the client goes away).
struct Held {
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
    in_flight: Option<Arc<(AtomicUsize, Notify)>>,
    stream: Option<(Arc<Limits>, String)>,
    /// The body was read to its end.
    finished: bool,
    abandoned: Option<OnAbandoned>,
}

/// A response body that holds its [`Held`] until it is dropped, and knows if it was read to
/// its end.
struct Guarded {
    inner: axum::body::BodyDataStream,
    held: Held,
}

impl futures::Stream for Guarded {
    type Item = Result<axum::body::Bytes, axum::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_next(cx);
        if let std::task::Poll::Ready(None) = r {
            self.held.finished = true;
        }
        r
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.finished
            && let Some(f) = self.abandoned.take()
        {
            f();
        }
        if let Some(f) = &self.in_flight
            && f.0.fetch_sub(1, Ordering::SeqCst) == 1
        {
            f.1.notify_waiters();
        }
        if let Some((limits, session)) = &self.stream {
            let mut s = limits.streams.lock().unwrap();
            if let Some(n) = s.get_mut(session) {
                *n -= 1;
                if *n == 0 {
                    s.remove(session);
                }
            }
        }
    }
}

/// A refusal of the bounds, logged, in `serve`'s one JSON error shape.
fn refuse(status: StatusCode, error: &str, why: String) -> Response {
    tracing::info!("refused a request: {why}");
    super::problem::problem(status, error, why)
}

impl Limits {
    pub(super) fn new(
        per_identity: usize,
        mcp_sessions_per_identity: usize,
        sessions: Arc<LocalSessionManager>,
    ) -> Arc<Limits> {
        Arc::new(Limits {
            per_identity,
            mcp_sessions_per_identity,
            sessions,
            slots: Mutex::default(),
            owners: Mutex::default(),
            streams: Mutex::default(),
            in_flight: Arc::new((AtomicUsize::new(0), Notify::new())),
        })
    }

    /// POSTs being answered now.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.0.load(Ordering::SeqCst)
    }

    /// Until no POST is being answered.
    pub(super) async fn idle(&self) {
        loop {
            let notified = self.in_flight.1.notified();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Run `request` of `identity` within the bounds, and remember the MCP session it creates.
    /// `abandoned` runs if the client goes away before the response's end.
    pub(super) async fn run(
        self: &Arc<Self>,
        identity: Identity,
        request: Request,
        next: Next,
        abandoned: Option<OnAbandoned>,
    ) -> Response {
        let session = request
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let Some(s) = &session {
            let owners = self.owners.lock().unwrap();
            if owners.0.get(s).is_some_and(|o| o != &identity) {
                // As rmcp answers an unknown session: nothing says it exists.
                return refuse(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "no such MCP session; send initialize to start one".into(),
                );
            }
        }
        let method = request.method().clone();
        let mut held = Held {
            _slot: None,
            in_flight: None,
            stream: None,
            finished: false,
            abandoned,
        };
        if method == Method::POST {
            let slot = {
                let mut slots = self.slots.lock().unwrap();
                slots
                    .entry(identity.clone())
                    .or_insert_with(|| Arc::new(Semaphore::new(self.per_identity)))
                    .clone()
            };
            let Ok(permit) = slot.try_acquire_owned() else {
                let mut r = refuse(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_requests",
                    format!(
                        "{} requests of this identity are in flight, the most http.max_requests_per_identity allows; wait for one to end",
                        self.per_identity
                    ),
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return r;
            };
            held._slot = Some(permit);
            self.in_flight.0.fetch_add(1, Ordering::SeqCst);
            held.in_flight = Some(self.in_flight.clone());
        } else if method == Method::GET
            && let Some(s) = &session
        {
            let mut streams = self.streams.lock().unwrap();
            let n = streams.entry(s.clone()).or_default();
            if *n >= SSE_STREAMS_PER_SESSION {
                drop(streams);
                return refuse(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_requests",
                    format!(
                        "this MCP session has {SSE_STREAMS_PER_SESSION} SSE streams open, the most allowed; close one first"
                    ),
                );
            }
            *n += 1;
            held.stream = Some((self.clone(), s.clone()));
        }
        let response = next.run(request).await;
        if let Some(created) = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            && !self.own(&created, &identity).await
        {
            // rmcp creates the session before its `initialize` is answered: the one beyond the
            // bound is closed at once, and its answer replaced by the refusal.
            let _ = self.sessions.close_session(&created.as_str().into()).await;
            return refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_requests",
                format!(
                    "this identity has {} MCP sessions open, the most http.max_mcp_sessions_per_identity allows; close one (DELETE /mcp with its Mcp-Session-Id) or let an idle one expire",
                    self.mcp_sessions_per_identity
                ),
            );
        }
        if method == Method::DELETE
            && response.status().is_success()
            && let Some(s) = &session
        {
            let mut owners = self.owners.lock().unwrap();
            owners.0.remove(s);
            owners.1.retain(|x| x != s);
        }
        let (parts, body) = response.into_parts();
        let body = Body::from_stream(Guarded {
            inner: body.into_data_stream(),
            held,
        });
        Response::from_parts(parts, body)
    }

    /// Record `session` as `identity`'s, if that identity has fewer than
    /// `http.max_mcp_sessions_per_identity` open; `false` if it has that many. Sessions rmcp
    /// has closed (expired, deleted) are forgotten when the count is reached.
    async fn own(&self, session: &str, identity: &Identity) -> bool {
        let mine = |owners: &(HashMap<String, Identity>, VecDeque<String>)| -> Vec<String> {
            owners
                .0
                .iter()
                .filter(|(_, o)| *o == identity)
                .map(|(s, _)| s.clone())
                .collect()
        };
        let record = |owners: &mut (HashMap<String, Identity>, VecDeque<String>)| {
            owners.0.insert(session.to_string(), identity.clone());
            owners.1.push_back(session.to_string());
            while owners.1.len() > MAX_OWNED_SESSIONS {
                if let Some(old) = owners.1.pop_front() {
                    owners.0.remove(&old);
                }
            }
        };
        let full = {
            let mut owners = self.owners.lock().unwrap();
            if owners.0.contains_key(session) {
                return true;
            }
            let mine = mine(&owners);
            if mine.len() < self.mcp_sessions_per_identity {
                record(&mut owners);
                return true;
            }
            mine
        };
        let closed: Vec<String> = {
            let open = self.sessions.sessions.read().await;
            full.into_iter()
                .filter(|s| s != session && !open.contains_key(s.as_str()))
                .collect()
        };
        let mut owners = self.owners.lock().unwrap();
        owners.0.retain(|s, _| !closed.contains(s));
        owners.1.retain(|s| !closed.contains(s));
        if mine(&owners).len() < self.mcp_sessions_per_identity {
            record(&mut owners);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bridge_core::config::http::Names;

    fn req(host: Option<&str>, origin: Option<&str>) -> Request {
        let mut b = Request::builder().uri("/mcp");
        if let Some(h) = host {
            b = b.header(header::HOST, h);
        }
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn hosts_and_origins() {
        let config = HttpConfig {
            allowed_hosts: Names(vec!["bridge.example".into()]),
            allowed_origins: Names(vec![
                "https://app.example".into(),
                "http://tool.example:*".into(),
            ]),
            ..HttpConfig::default()
        };
        let h = Hosts::new(&config, "0.0.0.0:8931".parse().unwrap());
        assert!(h.check(&req(Some("127.0.0.1:8931"), None)).is_ok());
        assert!(h.check(&req(Some("localhost"), None)).is_ok());
        assert!(h.check(&req(Some("[::1]:8931"), None)).is_ok());
        assert!(h.check(&req(Some("bridge.example:443"), None)).is_ok());
        assert!(
            h.check(&req(Some("evil.example:8931"), None))
                .unwrap_err()
                .to_string()
                .contains("http.allowed_hosts")
        );
        assert!(h.check(&req(None, None)).is_err());
        assert!(
            h.check(&req(Some("localhost"), Some("http://localhost:6274")))
                .is_ok()
        );
        assert!(
            h.check(&req(Some("localhost"), Some("https://app.example")))
                .is_ok()
        );
        assert!(
            h.check(&req(Some("localhost"), Some("https://app.example:443")))
                .is_ok()
        );
        assert!(
            h.check(&req(Some("localhost"), Some("https://app.example:8443")))
                .is_err()
        );
        assert!(
            h.check(&req(Some("localhost"), Some("http://tool.example:9")))
                .is_ok()
        );
        assert!(
            h.check(&req(Some("localhost"), Some("http://app.example")))
                .is_err()
        );
        assert!(
            h.check(&req(Some("localhost"), Some("https://evil.example")))
                .unwrap_err()
                .to_string()
                .contains("http.allowed_origins")
        );
        assert!(h.check(&req(Some("localhost"), Some("null"))).is_err());
        let any = HttpConfig {
            allowed_hosts: Names(vec!["*".into()]),
            ..HttpConfig::default()
        };
        assert!(
            Hosts::new(&any, "0.0.0.0:1".parse().unwrap())
                .check(&req(Some("x.example"), None))
                .is_ok()
        );
    }
}
