//! What a proxied call can reach of the `run_python` call that made it: the client's progress
//! (the server's progress notifications for the call) and the client's user (the server's
//! elicitation requests while the call runs).
//!
//! A server's progress names its request by the token rmcp put in it, so it finds its call
//! exactly. A server's question (`elicitation/create`) names no request on stdio: it goes to the
//! client of the calls that server has in flight when they all have one client (always so over
//! stdio, where the bridge has one client), and is declined otherwise, as it is when that client
//! cannot answer, or when the call ends before the answer comes.
//!
//! The upstream side knows nothing of rmcp's server role: the client is a [`ClientLink`], which
//! `server.rs` implements with the peer of the `run_python` request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction, ProgressToken};
use tokio_util::sync::CancellationToken;

/// What a proxied call reports while it runs: the server's progress notifications for it.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamProgress {
    /// The server that sent it.
    pub server: String,
    /// The tool whose call it is about, as the server lists it.
    pub tool: String,
    /// How far the call is, in the server's own unit; it only grows.
    pub progress: f64,
    /// What `progress` reaches when the call is done, when the server says.
    pub total: Option<f64>,
    /// The server's words on what it is doing, if any.
    pub message: Option<String>,
}

/// Receives a proxied call's progress (the `run_python` call's forwarder, which bounds what it
/// holds). Called on the connection's task: it must not block.
pub type ProgressSink = Arc<dyn Fn(UpstreamProgress) + Send + Sync>;

/// The client of a `run_python` call, as far as a proxied call may reach it.
#[async_trait::async_trait]
pub trait ClientLink: Send + Sync {
    /// Who the client is: questions of one server go to one client only.
    fn identity(&self) -> &bridge_core::identity::Identity;
    /// Whether the client declared it can answer questions of this kind.
    fn can_elicit(&self, request: &ElicitRequestParams) -> bool;
    /// Ask the client's user; `Err` says why no answer came.
    async fn elicit(&self, request: ElicitRequestParams) -> Result<ElicitResult, NoAnswer>;
}

/// Why a client's user gave no answer to a question (the question is then declined, or the
/// policy's fallback decides an approval).
#[derive(Debug, thiserror::Error)]
pub enum NoAnswer {
    /// The request to the client failed: the connection closed, it timed out, or the client
    /// answered with an error.
    #[error(transparent)]
    Request(#[from] rmcp::service::ServiceError),
    /// The `run_python` call's client is gone: nobody takes the call's questions any more.
    #[error("the call's client is gone")]
    ClientGone,
    /// The call ended (or was resumed without this answer) before the client answered.
    #[error("the client did not answer before the call ended")]
    CallEnded,
    /// What the client sent for this question is not an elicitation result.
    #[error("the client's answer to {key:?} is not an elicitation result: {source}")]
    BadAnswer {
        /// The question's key in its round.
        key: String,
        /// What was wrong with the answer.
        source: serde_json::Error,
    },
}

/// What one exec's proxied calls relay to its `run_python` call; empty when nobody listens.
#[derive(Clone, Default)]
pub struct CallRelay {
    /// Where the servers' progress for the calls goes; `None` drops it.
    pub progress: Option<ProgressSink>,
    /// The client the servers' questions go to; `None` declines them.
    pub client: Option<Arc<dyn ClientLink>>,
}

/// One call in flight on a connection.
#[derive(Clone)]
struct Route {
    tool: String,
    relay: CallRelay,
    /// Cancelled when the call ends: a question still open for it is withdrawn.
    ended: CancellationToken,
}

/// The calls in flight on one connection, by the progress token of each.
#[derive(Clone, Default)]
pub(super) struct Routes(Arc<Mutex<HashMap<ProgressToken, Route>>>);

impl Routes {
    /// Route what the server says about `token`'s call (of `tool`) to `relay` until the guard
    /// is dropped.
    pub(super) fn route(&self, token: ProgressToken, tool: &str, relay: &CallRelay) -> RouteGuard {
        let ended = CancellationToken::new();
        self.0.lock().unwrap().insert(
            token.clone(),
            Route {
                tool: tool.to_string(),
                relay: relay.clone(),
                ended: ended.clone(),
            },
        );
        RouteGuard {
            routes: self.clone(),
            token,
            ended,
        }
    }

    /// Where `token`'s progress goes: the call's tool and sink.
    pub(super) fn progress_of(&self, token: &ProgressToken) -> Option<(String, ProgressSink)> {
        let routes = self.0.lock().unwrap();
        let route = routes.get(token)?;
        Some((route.tool.clone(), route.relay.progress.clone()?))
    }

    /// Ask the client of `server`'s calls in flight, naming the server in the question; a
    /// decline when there is no such call, when they belong to different clients, when the
    /// client cannot answer or fails to, and when the calls end first.
    pub(super) async fn elicit(&self, server: &str, request: ElicitRequestParams) -> ElicitResult {
        let decline = |why: &str| {
            tracing::info!(
                server,
                "declined the server's question: {}",
                bridge_core::text::visible(why)
            );
            ElicitResult::new(ElicitationAction::Decline)
        };
        let (link, ended) = {
            let routes = self.0.lock().unwrap();
            let mut clients = routes
                .values()
                .map(|r| (r.relay.client.clone(), r.ended.clone()));
            let Some((first, ended)) = clients.next() else {
                return decline("no call to it is running");
            };
            let Some(link) = first else {
                return decline("the run_python call has no client to ask");
            };
            let all_same = clients.all(|(c, _)| c.is_some_and(|c| c.identity() == link.identity()));
            if !all_same {
                return decline(
                    "calls of several clients are running, and the question does not say whose it is",
                );
            }
            (link, ended)
        };
        if !link.can_elicit(&request) {
            return decline("the bridge's client does not support this kind of elicitation");
        }
        let request = named(server, request);
        tokio::select! {
            r = link.elicit(request) => match r {
                Ok(answer) => answer,
                Err(e) => decline(&format!("asking the client failed: {e}")),
            },
            () = ended.cancelled() => decline("the proxied call ended before the answer came"),
        }
    }
}

/// The question with the server's name in front, so the user knows who asks.
fn named(server: &str, mut request: ElicitRequestParams) -> ElicitRequestParams {
    if let ElicitRequestParams::FormElicitationParams { message, .. }
    | ElicitRequestParams::UrlElicitationParams { message, .. } = &mut request
    {
        *message = format!("MCP server '{server}' asks: {message}");
    }
    request
}

/// Ends a route when its call ends, however it ends.
pub(super) struct RouteGuard {
    routes: Routes,
    token: ProgressToken,
    ended: CancellationToken,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        self.ended.cancel();
        self.routes.0.lock().unwrap().remove(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bridge_core::identity::Identity;
    use rmcp::model::NumberOrString;

    struct Asked {
        id: Identity,
        form: bool,
        last: Mutex<Option<String>>,
    }

    #[async_trait::async_trait]
    impl ClientLink for Asked {
        fn identity(&self) -> &Identity {
            &self.id
        }
        fn can_elicit(&self, r: &ElicitRequestParams) -> bool {
            self.form && matches!(r, ElicitRequestParams::FormElicitationParams { .. })
        }
        async fn elicit(&self, r: ElicitRequestParams) -> Result<ElicitResult, NoAnswer> {
            if let ElicitRequestParams::FormElicitationParams { message, .. } = r {
                *self.last.lock().unwrap() = Some(message);
            }
            Ok(ElicitResult::new(ElicitationAction::Accept))
        }
    }

    fn question() -> ElicitRequestParams {
        serde_json::from_value(serde_json::json!({
            "mode": "form",
            "message": "Your name?",
            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}
        }))
        .unwrap()
    }

    fn token(n: i64) -> ProgressToken {
        ProgressToken(NumberOrString::Number(n))
    }

    fn link(id: &'static str, form: bool) -> (Arc<Asked>, CallRelay) {
        let a = Arc::new(Asked {
            id: Identity::Named(id.into()),
            form,
            last: Mutex::new(None),
        });
        let relay = CallRelay {
            progress: None,
            client: Some(a.clone()),
        };
        (a, relay)
    }

    #[tokio::test]
    async fn a_question_goes_to_the_one_client_named_and_is_declined_otherwise() {
        let routes = Routes::default();
        // No call in flight.
        let r = routes.elicit("s", question()).await;
        assert_eq!(r.action, ElicitationAction::Decline);

        let (a, relay) = link("one", true);
        let g1 = routes.route(token(1), "t", &relay);
        let g2 = routes.route(token(2), "t", &relay);
        let r = routes.elicit("files", question()).await;
        assert_eq!(r.action, ElicitationAction::Accept);
        assert_eq!(
            a.last.lock().unwrap().as_deref(),
            Some("MCP server 'files' asks: Your name?")
        );

        // A second client's call makes the question ambiguous.
        let (_, other) = link("two", true);
        let g3 = routes.route(token(3), "t", &other);
        assert_eq!(
            routes.elicit("s", question()).await.action,
            ElicitationAction::Decline
        );
        drop((g1, g2, g3));

        // A client that cannot answer forms.
        let (_, mute) = link("one", false);
        let _g = routes.route(token(4), "t", &mute);
        assert_eq!(
            routes.elicit("s", question()).await.action,
            ElicitationAction::Decline
        );
    }

    struct Never;

    #[async_trait::async_trait]
    impl ClientLink for Never {
        fn identity(&self) -> &Identity {
            &Identity::Local
        }
        fn can_elicit(&self, _: &ElicitRequestParams) -> bool {
            true
        }
        async fn elicit(&self, _: ElicitRequestParams) -> Result<ElicitResult, NoAnswer> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_question_is_withdrawn_when_its_call_ends() {
        let routes = Routes::default();
        let relay = CallRelay {
            progress: None,
            client: Some(Arc::new(Never)),
        };
        let guard = routes.route(token(1), "t", &relay);
        let asking = tokio::spawn({
            let routes = routes.clone();
            async move { routes.elicit("s", question()).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(guard);
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), asking)
            .await
            .expect("the question was not withdrawn")
            .unwrap();
        assert_eq!(r.action, ElicitationAction::Decline);
    }
}
