//! The audit record of a proxied call: its decision and rule as the log names them, and the
//! record written however the call ends (`RecordOnDrop`).

use std::time::Instant;

use bridge_core::audit::{Audit, Decision as AuditDecision, ToolCallRecord, ToolStatus};
use bridge_core::policy::{Decision, Verdict};
use bridge_core::trace;

/// The audit log's name for a verdict.
pub(super) fn audit_decision(v: Verdict) -> AuditDecision {
    match v {
        Verdict::Allow => AuditDecision::Allow,
        Verdict::Deny => AuditDecision::Deny,
        Verdict::AskAllowed => AuditDecision::AskAllowed,
        Verdict::AskDenied => AuditDecision::AskDenied,
        Verdict::AskUnavailable => AuditDecision::AskUnavailable,
    }
}

/// The rule of a decision and where it is set, as the audit log keeps it: `github.delete_*
/// (config.toml)`; `None` when no rule decided.
pub(super) fn rule_text(d: &Decision) -> Option<String> {
    let rule = d.rule.as_deref()?;
    Some(match d.origin.as_deref() {
        Some(origin) => format!("{rule} ({origin})"),
        None => rule.to_string(),
    })
}

/// A proxied call's `tool_call` record, written when the call is finished or, if its future is
/// dropped first (its exec timed out or was cancelled), as `failed` / `cancelled` then.
pub(super) struct RecordOnDrop<'a> {
    pub(super) audit: &'a Audit,
    /// The call's trace, current again when the record is written from a drop.
    pub(super) trace: trace::Context,
    pub(super) started: Instant,
    pub(super) record: Option<ToolCallRecord>,
    /// The status and error type written when the future is dropped first.
    pub(super) dropped: (ToolStatus, &'static str),
}

impl RecordOnDrop<'_> {
    pub(super) fn finish(&mut self, status: ToolStatus, error_type: Option<&str>) {
        let _current = self.trace.clone().attach();
        if let Some(mut r) = self.record.take() {
            r = r.finished(status, self.started.elapsed());
            if let Some(kind) = error_type {
                r = r.with_error_type(kind);
            }
            self.audit.tool_call(r);
        }
    }
}

impl Drop for RecordOnDrop<'_> {
    fn drop(&mut self) {
        let (status, why) = self.dropped;
        self.finish(status, Some(why));
    }
}
