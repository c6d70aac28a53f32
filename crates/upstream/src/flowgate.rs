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
use bridge_core::policy::{Approval, ApprovalRequest, Decision, Ruling, Verdict, shown_name};

/// Most suspect arguments a question lists (each names its argument, value and source).
const MAX_SHOWN: usize = 12;

/// The flow check's outcome for one call: the decision in force, and what the audit record and
/// the span say of the flow.
pub(super) struct FlowOutcome {
    pub(super) decision: Decision,
    pub(super) record: Option<FlowRecord>,
}

/// What `[policy.flows]` found of one checked call (an acting or open tool, flows on) before
/// anyone is asked.
pub(super) struct FlowCheck {
    suspects: Vec<Suspect>,
    on_suspect: OnSuspect,
    /// The rule a suspect flow is decided by, as people read it: `on_suspect`, each suspect
    /// argument and its source, and the label that made the call checked.
    rule: String,
    /// Where `on_suspect` is set.
    origin: String,
    /// The session grants that cover these flows (tool, argument and source).
    keys: Vec<String>,
}

impl FlowCheck {
    /// The session grants that would cover these flows.
    pub(super) fn keys(&self) -> &[String] {
        &self.keys
    }

    fn suspect(&self) -> bool {
        !self.suspects.is_empty()
    }

    fn made(&self, verdict: Verdict, allowed: bool, ask: Option<&'static str>) -> Decision {
        Decision {
            verdict,
            allowed,
            rule: Some(self.rule.clone()),
            origin: Some(self.origin.clone()),
            ask,
        }
    }

    /// The audit record of the flow, once `decision` (the flow's own, or the one question that
    /// covered the policy and the flow) is known.
    fn record(&self, decision: &Decision) -> FlowRecord {
        if !self.suspect() {
            return FlowRecord {
                decision: "clean".into(),
                sources: Vec::new(),
            };
        }
        let how = match (self.on_suspect, decision.ask) {
            (OnSuspect::Deny, _) => "suspect:deny".to_string(),
            (OnSuspect::Ask, Some("session_grant")) => "suspect:session_grant".to_string(),
            (OnSuspect::Ask, _) => format!("suspect:{}", decision.verdict.as_str()),
        };
        FlowRecord {
            decision: how,
            sources: self.suspects.iter().map(Suspect::summary).collect(),
        }
    }
}

impl ExecRpc {
    /// The decision of `ruling` (the policy's rule for `server.tool`), asking the user when it
    /// says `ask` and the session has not allowed the tool already. With `flows` (the call's
    /// suspect flows, `on_suspect = "ask"`), the question names them too and its answer covers
    /// them: a session grant allows the tool and those flows.
    pub(super) async fn decide(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
        ruling: &Ruling,
        flows: Option<&FlowCheck>,
    ) -> Decision {
        match ruling.action {
            Action::Allow => return ruling.decided(Verdict::Allow, true),
            Action::Deny => return ruling.decided(Verdict::Deny, false),
            Action::Ask => {}
        }
        let policy = self.up.policy();
        let key = policy_key(server, tool);
        let granted = || self.granted(&key);
        let fallback = || {
            ruling.asked(
                Verdict::AskUnavailable,
                policy.fallback().0 == Action::Allow,
                "fallback",
            )
        };
        if granted() {
            return ruling.asked(Verdict::AskAllowed, true, "session_grant");
        }
        let Some(approver) = self.call.approver.as_ref().filter(|a| a.can_ask()) else {
            return fallback();
        };
        let _one = self.asking.lock().await;
        if granted() {
            return ruling.asked(Verdict::AskAllowed, true, "session_grant");
        }
        let request = match flows {
            Some(check) => joined_question(server, tool, arguments, check, ruling),
            None => ApprovalRequest {
                server: server.to_string(),
                tool: tool.to_string(),
                arguments: bridge_core::policy::summarize_arguments(arguments),
                rule: ruling.rule.clone(),
                origin: ruling.origin.clone(),
                asked: bridge_core::policy::Asked::ToolCall,
            },
        };
        let path = approver.path();
        match approver.ask(&request).await {
            Approval::Once => ruling.asked(Verdict::AskAllowed, true, path),
            Approval::Session => {
                self.grant(&[key]);
                if let Some(check) = flows {
                    self.grant(check.keys());
                }
                ruling.asked(Verdict::AskAllowed, true, path)
            }
            Approval::Denied => ruling.asked(Verdict::AskDenied, false, path),
            Approval::Unavailable(why) => {
                tracing::warn!(
                    server,
                    tool,
                    "could not ask the client about a tool call: {why}; ask_fallback decides"
                );
                fallback()
            }
        }
    }

    /// The flows' check of a call of `server.tool`: `None` when flows are off or the tool is
    /// neither acting nor open.
    pub(super) fn flow_check(
        &self,
        server: &str,
        tool: &str,
        labels: &Labels,
        arguments: Option<&Map<String, Value>>,
    ) -> Option<FlowCheck> {
        let flows = self.up.flows();
        if !flows.is_on() || !labels.checked() {
            return None;
        }
        let suspects = flows.check(self.call.session.owner(), labels, arguments);
        let (on_suspect, origin) = flows.rules().on_suspect();
        // Where the label that made the call checked came from (a glob and its file, or an
        // annotation). Private text is suspect for an open tool: its open label says why.
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
        let keys = suspects.iter().map(|s| s.grant_key(server, tool)).collect();
        Some(FlowCheck {
            suspects,
            on_suspect,
            rule,
            origin: origin.to_string(),
            keys,
        })
    }

    /// The decision on a call of `server.tool`: the policy's, then, for a call it lets through,
    /// the flows' (`check`). The user is asked one question at most: a call the policy asks
    /// about and whose flow is suspect gets one question naming both, whose answer (and session
    /// grant) covers both; a suspect flow that `deny` refuses is refused without asking about
    /// the policy.
    pub(super) async fn judge(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
        destructive: bool,
        check: Option<FlowCheck>,
    ) -> FlowOutcome {
        let ruling = self.up.policy().rule_for(server, tool, destructive);
        let Some(check) = check else {
            let decision = self.decide(server, tool, arguments, &ruling, None).await;
            return FlowOutcome {
                decision,
                record: None,
            };
        };
        if ruling.action == Action::Deny {
            return FlowOutcome {
                decision: ruling.decided(Verdict::Deny, false),
                record: None,
            };
        }
        let decision = match check.on_suspect {
            _ if !check.suspect() => self.decide(server, tool, arguments, &ruling, None).await,
            OnSuspect::Deny => check.made(Verdict::Deny, false, None),
            OnSuspect::Ask => {
                let tool_granted =
                    ruling.action == Action::Allow || self.granted(&policy_key(server, tool));
                if !tool_granted && !self.all_granted(&check.keys) {
                    // One question for both; its answer decides both.
                    self.decide(server, tool, arguments, &ruling, Some(&check))
                        .await
                } else {
                    let policy = self.decide(server, tool, arguments, &ruling, None).await;
                    if !policy.allowed {
                        return FlowOutcome {
                            decision: policy,
                            record: None,
                        };
                    }
                    self.ask_flow(server, tool, &check).await
                }
            }
        };
        // A call the policy refused (its question denied, or its fallback) says nothing of
        // the flow unless the question was the flow's too.
        let record = (decision.allowed || check.suspect()).then(|| check.record(&decision));
        FlowOutcome { decision, record }
    }

    /// Whether this session allowed `key` (a tool, or a flow) already.
    pub(super) fn granted(&self, key: &str) -> bool {
        let interpreter = self.interpreter.get().map_or("", String::as_str);
        self.up.grants().has(&self.call.session, interpreter, key)
    }

    fn all_granted(&self, keys: &[String]) -> bool {
        keys.iter().all(|k| self.granted(k))
    }

    /// Ask the user about the suspect flows of one call the policy let through (unless this
    /// session allowed each of them already); the client that cannot be asked gets
    /// `policy.ask_fallback`.
    async fn ask_flow(&self, server: &str, tool: &str, check: &FlowCheck) -> Decision {
        if self.all_granted(&check.keys) {
            return check.made(Verdict::AskAllowed, true, Some("session_grant"));
        }
        let fallback = || {
            check.made(
                Verdict::AskUnavailable,
                self.up.policy().fallback().0 == Action::Allow,
                Some("fallback"),
            )
        };
        let Some(approver) = self.call.approver.as_ref().filter(|a| a.can_ask()) else {
            return fallback();
        };
        let _one = self.asking.lock().await;
        if self.all_granted(&check.keys) {
            return check.made(Verdict::AskAllowed, true, Some("session_grant"));
        }
        let request = ApprovalRequest::other(
            "Allow this flow?",
            question(server, tool, &check.suspects, None),
            check.rule.clone(),
            check.origin.clone(),
        );
        let path = approver.path();
        match approver.ask(&request).await {
            Approval::Once => check.made(Verdict::AskAllowed, true, Some(path)),
            Approval::Session => {
                self.grant(&check.keys);
                check.made(Verdict::AskAllowed, true, Some(path))
            }
            Approval::Denied => check.made(Verdict::AskDenied, false, Some(path)),
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

    /// Allow `keys` for the rest of this session.
    pub(super) fn grant(&self, keys: &[String]) {
        let interpreter = self.interpreter.get().map_or("", String::as_str);
        for k in keys {
            self.up.grants().grant(&self.call.session, interpreter, k);
        }
    }
}

/// The session grant's key of the tool `server.tool` (the policy's `ask`).
pub(super) fn policy_key(server: &str, tool: &str) -> String {
    format!("{server}.{tool}")
}

/// One question about the policy's `ask` of a call (`policy`'s rule) and the suspect flows of
/// `check`.
pub(super) fn joined_question(
    server: &str,
    tool: &str,
    arguments: Option<&Map<String, Value>>,
    check: &FlowCheck,
    policy: &Ruling,
) -> ApprovalRequest {
    ApprovalRequest::other(
        "Allow this tool call?",
        question(
            server,
            tool,
            &check.suspects,
            Some(PolicyAsk {
                rule: &policy.rule,
                origin: &policy.origin,
                arguments,
            }),
        ),
        check.rule.clone(),
        check.origin.clone(),
    )
}

/// The policy's `ask` of the same call, joined to a flow's question: its rule, where the rule
/// is set, and the call's arguments.
pub(super) struct PolicyAsk<'a> {
    rule: &'a str,
    origin: &'a str,
    arguments: Option<&'a Map<String, Value>>,
}

/// The question: the bridge's words first (the tool and server quoted; with `policy`, the
/// policy's `ask` rule of the same call and where it is set, which are the user's words), then
/// one line per suspect argument (its name and source quoted), then a counted block of the
/// values, escaped as the policy's questions show arguments and closed by an end line: the
/// suspect arguments' values, or with `policy` every argument of the call (what the policy's
/// own question would have shown).
pub(super) fn question(
    server: &str,
    tool: &str,
    suspects: &[Suspect],
    policy: Option<PolicyAsk<'_>>,
) -> String {
    let mut out = format!(
        "Code running in run_python wants to call the tool {} of the MCP server {} with arguments that may not be your intent: their values came from tool results that are someone else's words, or they carry private data to a tool that sends it on.\n",
        shown_name(tool),
        shown_name(server),
    );
    if let Some(p) = &policy {
        out.push_str(&format!(
            "The policy asks about every call of this tool too ({} in {}): this one answer decides both.\n",
            p.rule, p.origin
        ));
    }
    out.push_str("Where each came from:\n");
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
    let arguments = match policy {
        Some(p) => bridge_core::policy::summarize_arguments(p.arguments),
        None => {
            let mut shown = Map::new();
            for s in suspects.iter().take(MAX_SHOWN) {
                let v = serde_json::from_str(&s.value).unwrap_or(Value::String(s.value.clone()));
                shown.insert(s.argument.clone(), v);
            }
            bridge_core::policy::summarize_arguments(Some(&shown))
        }
    };
    out.push_str(&arguments);
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
        let q = question("bank", "send_money", &s, None);
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
