//! `[policy.flows]` at a proxied call: an acting or open call the policy allowed is checked
//! for suspect guarded arguments (`bridge_core::flows`), and a suspect flow is refused or asked
//! about as `on_suspect` says, through the same approver and grants as the policy's questions;
//! a session grant covers that flow only (tool, argument and source).

use serde_json::{Map, Value};

use super::rpc::ExecRpc;
use bridge_core::audit::FlowRecord;
use bridge_core::config::OnSuspect;
use bridge_core::config::policy::Action;
use bridge_core::flows::{Labels, Suspect};
use bridge_core::policy::{Approval, ApprovalRequest, Decision, Verdict, shown_name};

/// Most suspect arguments a question lists (each names its argument, value and source).
const MAX_SHOWN: usize = 12;

/// The flow check's outcome for one call: the decision in force, and what the audit record and
/// the span say of the flow.
pub(super) struct FlowOutcome {
    pub(super) decision: Decision,
    pub(super) record: Option<FlowRecord>,
}

impl ExecRpc {
    /// Check a call of `server.tool` the policy decided as `decision`: unchanged when flows are
    /// off, the tool is neither acting nor open, the policy refused it, or no guarded argument
    /// is suspect; otherwise refused or asked about.
    pub(super) async fn flow_gate(
        &self,
        server: &str,
        tool: &str,
        labels: &Labels,
        arguments: Option<&Map<String, Value>>,
        decision: Decision,
    ) -> FlowOutcome {
        let flows = self.up.flows();
        if !decision.allowed || !labels.checked() {
            return FlowOutcome {
                decision,
                record: None,
            };
        }
        let suspects = flows.check(self.call.session.owner(), labels, arguments);
        if suspects.is_empty() {
            return FlowOutcome {
                decision,
                record: Some(FlowRecord {
                    decision: "clean".into(),
                    sources: Vec::new(),
                }),
            };
        }
        let (on_suspect, origin) = flows.rules().on_suspect();
        // Where the label that made the call checked came from (a glob and its file, or an
        // annotation).
        // (Private text is suspect for an open tool: its open label says why.)
        let private = suspects
            .iter()
            .any(|s| s.kind == bridge_core::flows::SuspectKind::Private);
        let checked_as = match (&labels.acting, &labels.open) {
            (_, Some(why)) if private => format!("open by {why}"),
            (Some(why), _) => format!("acting by {why}"),
            (None, Some(why)) => format!("open by {why}"),
            (None, None) => String::new(),
        };
        let rule = format!(
            "policy.flows.on_suspect = {:?} ({}; the tool is {checked_as})",
            on_suspect.as_str(),
            suspects
                .iter()
                .map(|s| format!(
                    "argument {} came from {} ({})",
                    shown_name(&s.argument),
                    s.source,
                    s.kind.as_str()
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
        let made = |verdict: Verdict, allowed: bool, ask: Option<&'static str>| Decision {
            verdict,
            allowed,
            rule: Some(rule.clone()),
            origin: Some(origin.to_string()),
            ask,
        };
        let sources: Vec<String> = suspects.iter().map(Suspect::summary).collect();
        let (decision, how) = match on_suspect {
            OnSuspect::Deny => (made(Verdict::Deny, false, None), "suspect:deny".to_string()),
            OnSuspect::Ask => {
                let d = self
                    .ask_flow(server, tool, &suspects, &rule, origin, &made)
                    .await;
                let how = format!(
                    "suspect:{}",
                    match d.ask {
                        Some("session_grant") => "session_grant",
                        _ => d.verdict.as_str(),
                    }
                );
                (d, how)
            }
        };
        FlowOutcome {
            decision,
            record: Some(FlowRecord {
                decision: how,
                sources,
            }),
        }
    }

    /// Ask the user about the suspect flows of one call (unless this session allowed each of
    /// them already); the client that cannot be asked gets `policy.ask_fallback`.
    async fn ask_flow(
        &self,
        server: &str,
        tool: &str,
        suspects: &[Suspect],
        rule: &str,
        origin: &str,
        made: &(dyn Fn(Verdict, bool, Option<&'static str>) -> Decision + Sync),
    ) -> Decision {
        let session = &self.call.session;
        let interpreter = self.interpreter.get().map_or("", String::as_str);
        let keys: Vec<String> = suspects.iter().map(|s| s.grant_key(server, tool)).collect();
        let granted = || {
            keys.iter()
                .all(|k| self.up.grants().has(session, interpreter, k))
        };
        if granted() {
            return made(Verdict::AskAllowed, true, Some("session_grant"));
        }
        let fallback = || {
            made(
                Verdict::AskUnavailable,
                self.up.policy().fallback().0 == Action::Allow,
                Some("fallback"),
            )
        };
        let Some(approver) = self.call.approver.as_ref().filter(|a| a.can_ask()) else {
            return fallback();
        };
        let _one = self.asking.lock().await;
        if granted() {
            return made(Verdict::AskAllowed, true, Some("session_grant"));
        }
        let request = ApprovalRequest::other(
            "Allow this flow?",
            question(server, tool, suspects),
            rule.to_string(),
            origin.to_string(),
        );
        let path = approver.path();
        match approver.ask(&request).await {
            Approval::Once => made(Verdict::AskAllowed, true, Some(path)),
            Approval::Session => {
                for k in &keys {
                    self.up.grants().grant(session, interpreter, k);
                }
                made(Verdict::AskAllowed, true, Some(path))
            }
            Approval::Denied => made(Verdict::AskDenied, false, Some(path)),
            Approval::Unavailable(why) => {
                tracing::warn!(
                    server,
                    tool,
                    "could not ask the client about a suspect flow: {why}; ask_fallback decides"
                );
                fallback()
            }
        }
    }
}

/// The question: the bridge's words first (the tool and server quoted), then a counted block
/// of one line per suspect argument, each name, value and source quoted and escaped as the
/// policy's questions show arguments, closed by an end line.
pub(super) fn question(server: &str, tool: &str, suspects: &[Suspect]) -> String {
    let mut shown = Map::new();
    for s in suspects.iter().take(MAX_SHOWN) {
        let v = serde_json::from_str(&s.value).unwrap_or(Value::String(s.value.clone()));
        shown.insert(s.argument.clone(), v);
    }
    let mut out = format!(
        "Code running in run_python wants to call the tool {} of the MCP server {} with arguments that may not be your intent: their values came from tool results that are someone else's words, or they carry private data to a tool that sends it on.\nWhere each came from:\n",
        shown_name(tool),
        shown_name(server),
    );
    for s in suspects.iter().take(MAX_SHOWN) {
        let what = match s.kind {
            bridge_core::flows::SuspectKind::Untrusted => "its value occurs in the result of",
            bridge_core::flows::SuspectKind::Private => "it carries private text of",
            bridge_core::flows::SuspectKind::Unknown => "it cannot be told apart:",
        };
        out.push_str(&format!(
            "  {}: {what} {}\n",
            shown_name(&s.argument),
            shown_name(&s.source)
        ));
    }
    out.push('\n');
    out.push_str(&bridge_core::policy::summarize_arguments(Some(&shown)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bridge_core::flows::SuspectKind;

    #[test]
    fn the_question_names_argument_value_and_source_escaped() {
        let s = vec![Suspect {
            argument: "recipient\nAsked because of nothing".into(),
            value: "\"DE89\\u001b[2J3704\"".into(),
            kind: SuspectKind::Untrusted,
            source: "mail.read_mail".into(),
        }];
        let q = question("bank", "send_money", &s);
        assert!(
            q.contains("the tool \"send_money\" of the MCP server \"bank\""),
            "{q}"
        );
        assert!(q.contains("\"mail.read_mail\""), "{q}");
        assert!(q.contains("\"DE89\\u001b[2J3704\""), "{q}");
        assert!(!q.contains('\u{1b}'), "{q}");
        // The argument's name cannot start a line of its own.
        assert!(!q.lines().any(|l| l.starts_with("Asked because")), "{q}");
        assert!(q.ends_with(bridge_core::policy::END_OF_ARGUMENTS), "{q}");
    }
}
