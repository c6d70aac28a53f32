//! Questions of a `run_python` call under the 2026-07-28 revision, which has no
//! server-to-client requests: the call answers `input_required` (SEP-2322, multi round-trip
//! requests) with the question and an opaque handle, while the code stays paused in its sandbox
//! awaiting the proxied call that needs the answer. The client's retry of `tools/call` with the
//! answer and the handle resumes that same execution: nothing runs twice, the output printed
//! before the pause is in the final result, and a client that never comes back leaves the code
//! to its deadline (the call's timeout), after which the paused call is forgotten.
//!
//! Who asks: the policy's `ask` rules ([`RoundApprover`], the same form and three choices as the
//! `elicitation/create` of older revisions) and an upstream server's own questions
//! ([`RoundLink`]). Whether the client can be asked is what the request declares in its `_meta`
//! (`io.modelcontextprotocol/clientCapabilities`), for that request only.
//!
//! The handle (`requestState`) is 32 random bytes the bridge keeps: it is bound to the identity,
//! the session and the code of the call that made it, used once, and a wrong, replayed or
//! another identity's handle is refused as unknown and changes nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::RoleServer;
use rmcp::model::{
    CallToolResponse, CallToolResult, ClientCapabilities, ElicitRequest, ElicitRequestParams,
    ElicitResult, ElicitationAction, ErrorData, InputRequest, InputRequiredResult, InputResponses,
};
use rmcp::service::RequestContext;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::link::{approval_of, approval_schema};
use crate::progress::Streaming;
use crate::replies::refused;
use crate::run::Calls;
use crate::tool::RunArgs;
use bridge_core::error::{Hint, Hinted};
use bridge_core::identity::{Identity, SessionKey};
use bridge_core::policy::{Approval, ApprovalRequest, Approver};
use bridge_sandbox::OutputSink;
use bridge_upstream::{CallRelay, ClientLink, NoAnswer, ProgressSink, UpstreamProgress};

/// How long a paused call whose code has ended (its deadline passed, or it finished without
/// needing the answer) stays claimable by its client's retry, which then gets its result.
const KEEP_ENDED: Duration = Duration::from_secs(30);
/// Paused calls one identity may hold at once; beyond it the oldest is cancelled. Each holds a
/// session's execution, so the sessions bound them already; this bounds the ended ones kept for
/// [`KEEP_ENDED`].
const MAX_PAUSED_PER_OWNER: usize = 16;
/// Questions one round carries at most (threads of the code asking at once); the rest wait for
/// the next round.
const MAX_QUESTIONS_PER_ROUND: usize = 8;

/// What the request declared it can answer, read from its own `_meta`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Askable {
    pub form: bool,
    pub url: bool,
}

impl Askable {
    /// Form elicitation when the client declared elicitation with neither mode (the spec's
    /// backward-compatible reading), else each mode it names.
    pub(crate) fn of(caps: Option<&ClientCapabilities>) -> Askable {
        match caps.and_then(|c| c.elicitation.as_ref()) {
            None => Askable::default(),
            Some(e) if e.form.is_none() && e.url.is_none() => Askable {
                form: true,
                url: false,
            },
            Some(e) => Askable {
                form: e.form.is_some(),
                url: e.url.is_some(),
            },
        }
    }

    pub(crate) fn any(self) -> bool {
        self.form || self.url
    }

    fn allows(self, request: &ElicitRequestParams) -> bool {
        match request {
            ElicitRequestParams::FormElicitationParams { .. } => self.form,
            ElicitRequestParams::UrlElicitationParams { .. } => self.url,
            _ => false,
        }
    }
}

/// One question of the running code, waiting for its round.
pub(crate) struct Question {
    request: ElicitRequestParams,
    answer: oneshot::Sender<Result<ElicitResult, NoAnswer>>,
}

/// The code's side of the rounds: where its questions go. Cloned into the approver and the
/// upstream link of one call.
#[derive(Clone)]
struct Asker {
    tx: mpsc::Sender<Question>,
    askable: Askable,
}

impl Asker {
    async fn ask(&self, request: ElicitRequestParams) -> Result<ElicitResult, NoAnswer> {
        let (answer, rx) = oneshot::channel();
        self.tx
            .send(Question { request, answer })
            .await
            .map_err(|_| NoAnswer::ClientGone)?;
        rx.await.map_err(|_| NoAnswer::CallEnded)?
    }
}

/// `policy::Approver` by `input_required` rounds.
pub(crate) struct RoundApprover(Asker);

#[async_trait::async_trait]
impl Approver for RoundApprover {
    fn can_ask(&self) -> bool {
        self.0.askable.form
    }

    fn path(&self) -> &'static str {
        "input_required"
    }

    async fn ask(&self, request: &ApprovalRequest) -> Approval {
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: request.message(),
            requested_schema: approval_schema(request.title()),
        };
        approval_of(self.0.ask(params).await)
    }
}

/// `upstream::ClientLink` by `input_required` rounds: a server's question reaches the user in
/// the next round of the call that made the proxied call.
pub(crate) struct RoundLink {
    asker: Asker,
    identity: Identity,
}

#[async_trait::async_trait]
impl ClientLink for RoundLink {
    fn identity(&self) -> &Identity {
        &self.identity
    }

    fn can_elicit(&self, request: &ElicitRequestParams) -> bool {
        self.asker.askable.allows(request)
    }

    async fn elicit(&self, request: ElicitRequestParams) -> Result<ElicitResult, NoAnswer> {
        self.asker.ask(request).await
    }
}

/// Where a paused call's output and its proxied calls' progress go: the request being answered
/// at the moment (each round is a request of its own, with its own progress token), or nowhere
/// between rounds (the output is in the final result all the same).
#[derive(Clone, Default)]
pub(crate) struct Sinks(Arc<Mutex<Option<(OutputSink, ProgressSink)>>>);

impl Sinks {
    pub(crate) fn output(&self) -> OutputSink {
        let s = self.clone();
        Arc::new(move |stream, data: &str| {
            if let Some((out, _)) = &*s.0.lock().unwrap() {
                out(stream, data)
            }
        })
    }

    pub(crate) fn progress(&self) -> ProgressSink {
        let s = self.clone();
        Arc::new(move |p: UpstreamProgress| {
            if let Some((_, up)) = &*s.0.lock().unwrap() {
                up(p)
            }
        })
    }

    pub(crate) fn set(&self, to: Option<(OutputSink, ProgressSink)>) {
        *self.0.lock().unwrap() = to;
    }
}

/// Who may resume a paused call: the identity, the session name and the code of the call.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Binding {
    pub key: SessionKey,
    code: [u8; 32],
}

impl Binding {
    pub(crate) fn new(key: SessionKey, code: &str) -> Binding {
        Binding {
            key,
            code: Sha256::digest(code.as_bytes()).into(),
        }
    }
}

/// A call between rounds, or one running until its first question or its end.
pub(crate) struct Running {
    binding: Binding,
    run: tokio::task::JoinHandle<CallToolResult>,
    questions: mpsc::Receiver<Question>,
    /// The execution's own cancellation: the rounds' requests come and go, the code does not.
    cancel: CancellationToken,
    /// Cancelled when the run ends, so an ended call is forgotten after [`KEEP_ENDED`].
    ended: CancellationToken,
    pub sinks: Sinks,
    /// The questions of the last round, by key, waiting for the client's answers.
    pending: BTreeMap<String, oneshot::Sender<Result<ElicitResult, NoAnswer>>>,
    next_key: u64,
}

/// What a new call's run is given: the links to pass to `Calls::run_for`.
pub(crate) struct Links {
    pub approver: RoundApprover,
    pub client: RoundLink,
    pub cancel: CancellationToken,
    pub sinks: Sinks,
}

impl Running {
    /// The channels of a new call: hand `Links` to the run, then [`Running::spawn`] it.
    pub(crate) fn links(askable: Askable, identity: Identity) -> (Links, mpsc::Receiver<Question>) {
        let (tx, rx) = mpsc::channel(MAX_QUESTIONS_PER_ROUND);
        let asker = Asker { tx, askable };
        let links = Links {
            approver: RoundApprover(asker.clone()),
            client: RoundLink { asker, identity },
            cancel: CancellationToken::new(),
            sinks: Sinks::default(),
        };
        (links, rx)
    }

    pub(crate) fn spawn(
        binding: Binding,
        cancel: CancellationToken,
        sinks: Sinks,
        questions: mpsc::Receiver<Question>,
        run: impl std::future::Future<Output = CallToolResult> + Send + 'static,
    ) -> Running {
        let ended = CancellationToken::new();
        let guard = ended.clone().drop_guard();
        let run = tokio::spawn(async move {
            let _ended = guard;
            run.await
        });
        Running {
            binding,
            run,
            questions,
            cancel,
            ended,
            sinks,
            pending: BTreeMap::new(),
            next_key: 0,
        }
    }

    /// Deliver the client's answers to the last round's questions. A question without an
    /// answer, or with one that is no `ElicitResult`, is declined: silence never approves.
    fn answer(&mut self, responses: Option<InputResponses>) {
        let mut responses = responses.unwrap_or_default();
        for (key, tx) in std::mem::take(&mut self.pending) {
            let result = match responses.remove(&key) {
                Some(v) => serde_json::from_value::<ElicitResult>(v).map_err(|source| {
                    NoAnswer::BadAnswer {
                        key: key.clone(),
                        source,
                    }
                }),
                None => Ok(ElicitResult::new(ElicitationAction::Decline)),
            };
            let _ = tx.send(result);
        }
    }

    /// Run until the code asks or ends, or the request is cancelled (then the code is
    /// interrupted, as a cancelled call's is). A question becomes `input_required`, whose
    /// handle is registered in `paused`.
    pub(crate) async fn drive(
        mut self,
        request: &CancellationToken,
        paused: &Paused,
    ) -> CallToolResponse {
        let session = self.binding.key.name().to_string();
        tokio::select! {
            r = &mut self.run => CallToolResponse::Complete(joined(r, &session)),
            q = self.questions.recv() => match q {
                Some(q) => self.pause(q, paused),
                // Every asker is gone: the run is ending.
                None => CallToolResponse::Complete(joined((&mut self.run).await, &session)),
            },
            () = request.cancelled() => {
                self.cancel.cancel();
                CallToolResponse::Complete(joined((&mut self.run).await, &session))
            }
        }
    }

    /// The round for `first` and any other question already waiting.
    fn pause(mut self, first: Question, paused: &Paused) -> CallToolResponse {
        let mut requests = BTreeMap::new();
        let mut next = Some(first);
        while let Some(q) = next.take() {
            self.next_key += 1;
            let key = format!("q{}", self.next_key);
            requests.insert(
                key.clone(),
                InputRequest::Elicitation(ElicitRequest::new(q.request)),
            );
            self.pending.insert(key, q.answer);
            if requests.len() < MAX_QUESTIONS_PER_ROUND {
                next = self.questions.try_recv().ok();
            }
        }
        let state = paused.insert(self);
        CallToolResponse::InputRequired(InputRequiredResult::new(Some(requests), Some(state)))
    }
}

/// A run's result; a run that panicked or was aborted still answers the call.
fn joined(r: Result<CallToolResult, tokio::task::JoinError>, session: &str) -> CallToolResult {
    r.unwrap_or_else(|e| {
        tracing::error!("a paused run_python call ended abnormally: {e}");
        crate::render::setup_error(
            "InternalError",
            "the call ended abnormally while it waited for the client's answer; run it again",
            session,
        )
    })
}

/// Why a retry's `requestState` was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResumeError {
    #[error(
        "requestState is unknown: it was used already, its call ended more than {}s ago, or it \
         belongs to another call",
        KEEP_ENDED.as_secs()
    )]
    Unknown,
    #[error(
        "requestState belongs to a call with other arguments (session or code); a retry must \
         send the same arguments as the call that was answered input_required"
    )]
    OtherCall,
}

impl Hinted for ResumeError {
    fn hint(&self) -> Option<Hint> {
        Some(Hint::clause(
            "call run_python again without requestState: the code runs afresh (state kept by the session stays)",
        ))
    }
}

impl ResumeError {
    pub(crate) fn into_error(self) -> ErrorData {
        ErrorData::invalid_params(self.message(), None)
    }
}

/// The paused calls, by handle. Shared by every connection of a bridge.
#[derive(Clone, Default)]
pub(crate) struct Paused(Arc<Mutex<HashMap<String, (Instant, Running)>>>);

impl Paused {
    /// A 2026-07-28 `tools/call` whose client can be asked (or that answers a question): a new
    /// call runs in the background (on `calls`) until it asks or ends; a retry with
    /// `request_state` resumes the paused call it names with the answers. Each round streams
    /// the output to its own request's progress token while it lasts (as `streaming` says).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn call(
        &self,
        calls: &Calls,
        streaming: &Streaming,
        key: SessionKey,
        args: RunArgs,
        request_state: Option<String>,
        responses: Option<InputResponses>,
        askable: Askable,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let binding = Binding::new(key.clone(), &args.code);
        let running = match request_state {
            Some(state) => self
                .take(&state, &binding, responses)
                .map_err(|e| refused("tools/call", e.into_error()))?,
            None => {
                let (links, questions) = Running::links(askable, key.owner().clone());
                let Links {
                    approver,
                    client,
                    cancel,
                    sinks,
                } = links;
                let relay = CallRelay {
                    progress: Some(sinks.progress()),
                    client: Some(Arc::new(client)),
                };
                let calls = calls.clone();
                let out = sinks.output();
                let parent = bridge_core::trace::parent_of(&context.meta);
                let run_cancel = cancel.clone();
                Running::spawn(binding, cancel, sinks, questions, async move {
                    calls
                        .run_for(
                            key,
                            args,
                            run_cancel,
                            Some(out),
                            Some(Arc::new(approver)),
                            relay,
                            parent,
                        )
                        .await
                })
            }
        };
        let forwarder = streaming.start(context).map(|(f, out, up)| {
            running.sinks.set(Some((out, up)));
            f
        });
        let sinks = running.sinks.clone();
        let response = running.drive(&context.ct, self).await;
        sinks.set(None);
        if let Some(f) = forwarder {
            f.finish().await;
        }
        Ok(response)
    }

    /// Keep `running` under a new handle, forget it once its code has ended and
    /// [`KEEP_ENDED`] has passed, and keep the owner's count within [`MAX_PAUSED_PER_OWNER`].
    fn insert(&self, running: Running) -> String {
        let handle = new_handle();
        let owner = running.binding.key.owner().clone();
        let ended = running.ended.clone();
        let evicted = {
            let mut map = self.0.lock().unwrap();
            let mut evicted = None;
            let mine: Vec<(Instant, String)> = map
                .iter()
                .filter(|(_, (_, r))| *r.binding.key.owner() == owner)
                .map(|(h, (t, _))| (*t, h.clone()))
                .collect();
            if mine.len() >= MAX_PAUSED_PER_OWNER
                && let Some((_, oldest)) = mine.into_iter().min()
            {
                evicted = map.remove(&oldest);
            }
            map.insert(handle.clone(), (Instant::now(), running));
            evicted
        };
        if let Some((_, r)) = evicted {
            tracing::info!(
                "a paused run_python call was dropped: its owner has {MAX_PAUSED_PER_OWNER} newer ones"
            );
            r.cancel.cancel();
        }
        let this = self.clone();
        let h = handle.clone();
        tokio::spawn(async move {
            ended.cancelled().await;
            tokio::time::sleep(KEEP_ENDED).await;
            if this.0.lock().unwrap().remove(&h).is_some() {
                tracing::debug!("a paused call's client did not come back; forgotten");
            }
        });
        handle
    }

    /// Take the call `handle` names for its retry: once, by the binding that made it. A handle
    /// of another identity is as unknown as one never made.
    pub(crate) fn take(
        &self,
        handle: &str,
        binding: &Binding,
        responses: Option<InputResponses>,
    ) -> Result<Running, ResumeError> {
        let mut map = self.0.lock().unwrap();
        match map.get(handle) {
            None => return Err(ResumeError::Unknown),
            Some((_, r)) if r.binding.key.owner() != binding.key.owner() => {
                return Err(ResumeError::Unknown);
            }
            Some((_, r)) if r.binding != *binding => return Err(ResumeError::OtherCall),
            Some(_) => {}
        }
        let (_, mut running) = map.remove(handle).expect("present");
        drop(map);
        running.answer(responses);
        Ok(running)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// 32 random bytes, hex: a handle nobody can guess.
fn new_handle() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS random source");
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn caps(v: Value) -> ClientCapabilities {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn what_a_request_declares_decides_whether_it_can_be_asked() {
        assert_eq!(Askable::of(None), Askable::default());
        assert!(!Askable::of(Some(&caps(json!({})))).any());
        let bare = Askable::of(Some(&caps(json!({"elicitation": {}}))));
        assert!(bare.form && !bare.url);
        let url = Askable::of(Some(&caps(json!({"elicitation": {"url": {}}}))));
        assert!(!url.form && url.url);
    }

    fn key(owner: &str) -> SessionKey {
        SessionKey::new(Identity::Named(owner.into()), "default")
    }

    async fn paused_call(owner: &str, code: &str) -> (Paused, String, Binding) {
        let paused = Paused::default();
        let (links, rx) = Running::links(
            Askable {
                form: true,
                url: false,
            },
            key(owner).owner().clone(),
        );
        let Links {
            approver,
            cancel,
            sinks,
            ..
        } = links;
        let a = Arc::new(approver);
        let binding = Binding::new(key(owner), code);
        let running = Running::spawn(binding.clone(), cancel, sinks, rx, async move {
            let r = ApprovalRequest {
                server: "s".into(),
                tool: "t".into(),
                arguments: "(none)".into(),
                rule: "r".into(),
                origin: "o".into(),
                asked: Default::default(),
            };
            let text = format!("{:?}", a.ask(&r).await);
            CallToolResult::success(vec![rmcp::model::ContentBlock::text(text)])
        });
        let request = CancellationToken::new();
        let CallToolResponse::InputRequired(ir) = running.drive(&request, &paused).await else {
            panic!("no question")
        };
        let handle = ir.request_state.unwrap();
        assert_eq!(ir.input_requests.unwrap().len(), 1);
        (paused, handle, binding)
    }

    #[tokio::test]
    async fn a_handle_resumes_its_call_once_and_for_its_owner_only() {
        let (paused, handle, binding) = paused_call("alice", "x").await;
        assert_eq!(handle.len(), 64);
        // Another identity: unknown, and nothing is consumed.
        let bob = Binding::new(key("bob"), "x");
        assert!(matches!(
            paused.take(&handle, &bob, None),
            Err(ResumeError::Unknown)
        ));
        // Other code, same identity: refused, nothing consumed.
        let other = Binding::new(key("alice"), "y");
        assert!(matches!(
            paused.take(&handle, &other, None),
            Err(ResumeError::OtherCall)
        ));
        assert!(matches!(
            paused.take("00", &binding, None),
            Err(ResumeError::Unknown)
        ));
        assert_eq!(paused.len(), 1);
        let answer = json!({"q1": {"action": "accept", "content": {"decision": "allow_once"}}});
        let running = paused
            .take(&handle, &binding, serde_json::from_value(answer).ok())
            .unwrap();
        let CallToolResponse::Complete(r) = running.drive(&CancellationToken::new(), &paused).await
        else {
            panic!("asked again")
        };
        assert!(format!("{r:?}").contains("Once"), "{r:?}");
        // Replayed: unknown.
        assert!(matches!(
            paused.take(&handle, &binding, None),
            Err(ResumeError::Unknown)
        ));
    }

    #[tokio::test]
    async fn no_answer_is_a_decline() {
        let (paused, handle, binding) = paused_call("alice", "x").await;
        let running = paused.take(&handle, &binding, None).unwrap();
        let CallToolResponse::Complete(r) = running.drive(&CancellationToken::new(), &paused).await
        else {
            panic!("asked again")
        };
        assert!(format!("{r:?}").contains("Denied"), "{r:?}");
    }
}
