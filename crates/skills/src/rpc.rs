//! The skills' RPC methods (`docs/protocol.md`), answered in front of an exec's upstream
//! handler: `save_skill`, `list_skills`, `delete_skill` and `load_skills` here, every other
//! method passed on unchanged (its failure kind included). The store's file work runs on the
//! blocking pool, so a slow disk holds no runtime thread.

use std::sync::Arc;

use serde_json::{Value, json};

use super::store::{BrokenSkill, SkillError, Store};
use bridge_core::protocol::{ExecBinding, RpcFailure, RpcHandler};

/// The RPC methods of skills; [`SkillRpc`] answers these and passes on the rest.
pub const METHODS: &[&str] = &["save_skill", "list_skills", "delete_skill", "load_skills"];

/// Most bytes of sources and descriptions one `load_skills` reply carries, whatever `[skills]`
/// allows in the store (up to 1000 × 1 MiB): each new interpreter receives and compiles them, and
/// the reply is one frame on the sandbox's stdin. Skills past it are named as not loaded.
pub const LOAD_BUDGET: usize = 16 << 20;

/// An exec's RPC handler with the skills' methods in front of `inner`.
pub struct SkillRpc {
    store: Arc<Store>,
    gate: Option<SaveGate>,
    inner: Arc<dyn RpcHandler>,
}

/// What decides a `save_skill` (`skills.save`): a saved skill runs in every later session, so
/// a prompt injection could persist through one. `ask` shows the user the skill's name,
/// description and the start of its source; every decision is audited.
#[derive(Clone)]
pub struct SaveGate {
    /// `skills.save`: allow, ask or deny every save.
    pub rule: bridge_core::config::policy::Action,
    /// What `ask` means when the client cannot be asked (`policy.ask_fallback`).
    pub fallback: bridge_core::config::policy::Fallback,
    /// The client of the call to ask; `None` when there is none to ask.
    pub approver: Option<Arc<dyn bridge_core::policy::Approver>>,
    /// Where each decision is recorded.
    pub audit: bridge_core::audit::Audit,
    /// The session saving it: as logs show it (`identity/session`), it is kept as `saved_by`.
    pub key: bridge_core::identity::SessionKey,
}

/// Lines of a skill's source the question shows, and characters of each.
const PREVIEW_LINES: usize = 40;
const PREVIEW_WIDTH: usize = 160;

/// `text` for the question, a line per line with `prefix`: escaped (`text::visible`), a run
/// of more than eight blanks inside a line shown as its count (so spaces cannot push code out
/// of sight), each line past [`PREVIEW_WIDTH`] characters cut with the count of what was cut,
/// and past [`PREVIEW_LINES`] lines the count of the lines not shown.
fn preview(text: &str, prefix: &str) -> String {
    let mut out = String::new();
    let lines: Vec<&str> = text.lines().collect();
    for l in lines.iter().take(PREVIEW_LINES) {
        let indent = l.len() - l.trim_start().len();
        let (lead, rest) = l.split_at(indent);
        let mut shown = bridge_core::text::visible(lead).into_owned();
        // Runs of blanks and of the rest, in turn.
        let mut run = String::new();
        let mut blank_run = false;
        let flush = |run: &mut String, blank: bool, shown: &mut String, last: bool| {
            if run.is_empty() {
                return;
            }
            let n = run.chars().count();
            if blank && last {
                shown.push_str(&format!("⟨{n} trailing blanks⟩"));
            } else if blank && n > 8 {
                shown.push_str(&format!("⟨{n} blanks⟩"));
            } else {
                shown.push_str(&bridge_core::text::visible(run));
            }
            run.clear();
        };
        for c in rest.chars() {
            let blank = c == ' ' || c == '\t';
            if blank != blank_run {
                flush(&mut run, blank_run, &mut shown, false);
                blank_run = blank;
            }
            run.push(c);
        }
        flush(&mut run, blank_run, &mut shown, true);
        let n = shown.chars().count();
        if n > PREVIEW_WIDTH {
            let head: String = shown.chars().take(PREVIEW_WIDTH).collect();
            out.push_str(&format!(
                "{prefix}{head}… (cut: {} more characters of this line not shown)\n",
                n - PREVIEW_WIDTH
            ));
        } else {
            out.push_str(&format!("{prefix}{shown}\n"));
        }
    }
    if lines.len() > PREVIEW_LINES {
        out.push_str(&format!(
            "{prefix}... {} more lines not shown\n",
            lines.len() - PREVIEW_LINES
        ));
    }
    out
}

impl SaveGate {
    /// Allowed (with the decision's name), or refused (with the message for the code).
    async fn decide(
        &self,
        name: &str,
        description: &str,
        source: &str,
    ) -> Result<String, (String, String)> {
        use bridge_core::config::policy::{Action, Fallback};
        use bridge_core::policy::{Approval, ApprovalRequest};
        let fallback = |path: &str| {
            match self.fallback {
            Fallback::Allow => Ok(format!("ask:unavailable ({path})")),
            Fallback::Deny => Err((
                "ask:unavailable".to_string(),
                "saving the skill was refused: skills.save is ask and the client cannot be asked (policy.ask_fallback = deny)".to_string(),
            )),
        }
        };
        match self.rule {
            Action::Allow => Ok("allow".into()),
            Action::Deny => Err((
                "deny".into(),
                "saving skills is turned off by the user (skills.save = deny); keep the function in this session's code instead".into(),
            )),
            Action::Ask => {
                let Some(approver) = self.approver.as_ref().filter(|a| a.can_ask()) else {
                    return fallback("fallback");
                };
                let lines = source.lines().count();
                let text = format!(
                    "Code running in run_python wants to save the skill {}: a function every later session will have defined, and may run.\nDescription ({} lines; every later model reads it):\n{}(end of description)\nSource ({lines} lines, {} characters, sha256 {}):\n{}(end of source)",
                    bridge_core::policy::shown_name(name),
                    description.lines().count(),
                    preview(description, "  > "),
                    source.chars().count(),
                    &bridge_core::audit::code_sha256(source)[..16],
                    preview(source, "  | "),
                );
                let request = ApprovalRequest::other(
                    "Save this skill?",
                    text,
                    "skills.save = ask".into(),
                    "the bridge's configuration".into(),
                );
                let path = approver.path();
                match approver.ask(&request).await {
                    Approval::Once | Approval::Session => Ok(format!("ask:allowed ({path})")),
                    Approval::Denied => Err((
                        "ask:denied".into(),
                        "saving the skill was refused by the user; do not save it again".into(),
                    )),
                    Approval::Unavailable(_) => fallback("fallback"),
                }
            }
        }
    }
}

impl SkillRpc {
    /// `binding` with the skills' methods in front of its handler and its `skills` flag saying
    /// whether the store holds any (what `run_python` and `exec` both hand the sandbox).
    pub fn bind(store: &Arc<Store>, binding: ExecBinding, gate: SaveGate) -> ExecBinding {
        ExecBinding {
            rpc: Arc::new(SkillRpc {
                store: store.clone(),
                gate: Some(gate),
                inner: binding.rpc,
            }),
            skills: store.any(),
            ..binding
        }
    }

    /// The handler with every save allowed (the tests of the store's methods).
    pub fn wrap(store: Arc<Store>, inner: Arc<dyn RpcHandler>) -> Arc<dyn RpcHandler> {
        Arc::new(SkillRpc {
            store,
            gate: None,
            inner,
        })
    }

    async fn own(&self, method: &str, params: Value) -> Result<Value, RpcFailure> {
        let mut by = String::new();
        if method == "save_skill"
            && let Some(gate) = &self.gate
        {
            let name = params.get("name").and_then(Value::as_str).unwrap_or("");
            let source = params.get("source").and_then(Value::as_str).unwrap_or("");
            let description = params
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("");
            // What could never be saved is refused before anyone is asked about it.
            let store = self.store.clone();
            let (n, s, d) = (
                name.to_string(),
                source.to_string(),
                description.to_string(),
            );
            tokio::task::spawn_blocking(move || store.check_save(&n, &s, &d))
                .await
                .map_err(|e| RpcFailure::from(format!("the skill store failed: {e}")))?
                .map_err(|e| RpcFailure::from(bridge_core::error::Hinted::message(&e)))?;
            let decided = gate.decide(name, description, source).await;
            let record = |decision: &str, status: &str| {
                gate.audit.skill_save(bridge_core::audit::SkillSaveRecord {
                    session: gate.key.to_string(),
                    identity: gate.key.owner().name().map(str::to_string),
                    skill: name.to_string(),
                    source_sha256: bridge_core::audit::code_sha256(source),
                    decision: decision.to_string(),
                    ask: None,
                    status: status.to_string(),
                })
            };
            match decided {
                Ok(decision) => {
                    record(&decision, "ok");
                    by = format!("{} ({decision})", gate.key);
                }
                Err((decision, message)) => {
                    record(&decision, "denied");
                    return Err(RpcFailure {
                        message,
                        kind: Some(bridge_core::protocol::RPC_DENIED),
                    });
                }
            }
        }
        let store = self.store.clone();
        let method = method.to_string();
        tokio::task::spawn_blocking(move || answer(&store, &method, &params, &by))
            .await
            .map_err(|e| RpcFailure::from(format!("the skill store failed: {e}")))?
            .map_err(|e| RpcFailure::from(bridge_core::error::Hinted::message(&e)))
    }
}

fn string_param<'a>(params: &'a Value, key: &str, method: &str) -> Result<&'a str, SkillError> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| SkillError::InvalidName {
            name: format!("<{method} without a string {key:?}>"),
        })
}

fn answer(store: &Store, method: &str, params: &Value, by: &str) -> Result<Value, SkillError> {
    match method {
        "save_skill" => {
            let name = string_param(params, "name", method)?;
            let source = params.get("source").and_then(Value::as_str).unwrap_or("");
            let description = params
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("");
            let saved = store.save_by(name, source, description, by)?;
            Ok(json!({"name": name, "replaced": saved.replaced, "count": saved.count}))
        }
        "delete_skill" => {
            let name = string_param(params, "name", method)?;
            store.remove(name)?;
            Ok(json!({"name": name}))
        }
        "list_skills" => {
            let listing = store.list()?;
            let skills: Vec<Value> = listing
                .skills
                .iter()
                .map(|s| json!({"name": s.name, "description": s.description, "saved_at": s.saved_at, "saved_by": s.saved_by, "sha256": s.sha256}))
                .collect();
            Ok(json!({"skills": skills, "broken": listing.broken}))
        }
        // Everything the runtime defines in a new session: sources included.
        "load_skills" => {
            let mut listing = store.list()?;
            let mut skills = Vec::new();
            let mut sent = 0usize;
            for s in listing.skills {
                sent += s.source.len() + s.description.len();
                if sent > LOAD_BUDGET {
                    listing.broken.push(BrokenSkill {
                        reason: format!(
                            "the skills a session defines are at most {} MiB together; remove some (`mcp-code-bridge skills rm NAME`)",
                            LOAD_BUDGET >> 20
                        ),
                        name: s.name,
                    });
                    continue;
                }
                skills.push(
                    json!({"name": s.name, "description": s.description, "source": s.source}),
                );
            }
            Ok(json!({"skills": skills, "broken": listing.broken}))
        }
        _ => unreachable!("only METHODS are answered here"),
    }
}

#[async_trait::async_trait]
impl RpcHandler for SkillRpc {
    async fn handle(&self, method: &str, params: Value) -> Result<Value, RpcFailure> {
        if METHODS.contains(&method) {
            return self.own(method, params).await;
        }
        self.inner.handle(method, params).await
    }

    fn on_interpreter(&self, interpreter: &bridge_core::protocol::Interpreter) {
        self.inner.on_interpreter(interpreter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn skills_methods_are_answered_and_others_passed_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::new(dir.path().join("skills"), 1024, 2));
        let rpc = SkillRpc::wrap(store, ExecBinding::empty().rpc);
        let saved = rpc
            .handle(
                "save_skill",
                json!({"name": "double", "source": "def double(x):\n    return 2 * x\n", "description": "Twice x."}),
            )
            .await
            .unwrap();
        assert_eq!(saved["replaced"], false);
        let loaded = rpc.handle("load_skills", json!({})).await.unwrap();
        assert_eq!(loaded["skills"][0]["name"], "double");
        assert!(
            loaded["skills"][0]["source"]
                .as_str()
                .unwrap()
                .contains("2 * x")
        );
        let listed = rpc.handle("list_skills", json!({})).await.unwrap();
        assert_eq!(listed["skills"][0]["description"], "Twice x.");
        assert!(listed["skills"][0].get("source").is_none());
        // Not a skills method: the inner handler's answer.
        assert_eq!(
            rpc.handle("list_servers", json!({})).await.unwrap(),
            json!([])
        );
        let err = rpc
            .handle("save_skill", json!({"name": "../x", "source": ""}))
            .await
            .unwrap_err()
            .message;
        assert!(err.contains("not a valid skill name"), "{err}");
        assert!(err.contains("ASCII letters"), "{err}");
        let err = rpc
            .handle("delete_skill", json!({"name": "nope"}))
            .await
            .unwrap_err()
            .message;
        assert!(err.contains("no skill named \"nope\""), "{err}");
    }

    #[tokio::test]
    async fn load_skills_stops_at_its_budget() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::new(dir.path().join("skills"), 1 << 20, 40));
        let body = "#".repeat((1 << 20) - 64);
        for i in 0..20 {
            let source = format!("def s{i:02}():\n    pass\n{body}\n");
            store.save(&format!("s{i:02}"), &source, "").unwrap();
        }
        let rpc = SkillRpc::wrap(store, ExecBinding::empty().rpc);
        let loaded = rpc.handle("load_skills", json!({})).await.unwrap();
        let sent: usize = loaded["skills"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["source"].as_str().unwrap().len())
            .sum();
        assert!(sent <= LOAD_BUDGET, "{sent}");
        let broken = loaded["broken"].as_array().unwrap();
        assert_eq!(
            loaded["skills"].as_array().unwrap().len() + broken.len(),
            20
        );
        assert!(!broken.is_empty());
        assert!(
            broken[0]["reason"].as_str().unwrap().contains("16 MiB"),
            "{broken:?}"
        );
    }
}
