//! The client of a request as the bridge reaches back to it: the approval question asked by
//! elicitation, and the link a proxied call's server questions go through.

use rmcp::RoleServer;
use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction};
use serde_json::{Value, json};

use bridge_core::identity::Identity;
use bridge_core::policy::{Approval, ApprovalRequest, Approver};
use bridge_upstream::{ClientLink, NoAnswer};

/// Asks the human through the MCP client of a `run_python` request: an `elicitation/create`
/// request in form mode, one field with the three choices.
pub(super) struct ClientApprover(pub(super) rmcp::Peer<RoleServer>);

/// The approval form's choice that allows this one call (shown as "Allow once").
pub const APPROVE_ONCE: &str = "allow_once";
/// The approval form's choice that allows the same tool for the rest of the session (shown as
/// "Allow for this session").
pub const APPROVE_SESSION: &str = "allow_session";
/// The approval form's choice that refuses the call (shown as "Deny").
pub const APPROVE_DENY: &str = "deny";

/// The approval form: one required field, `decision`, a titled single choice.
pub fn approval_schema(title: &str) -> rmcp::model::ElicitationSchema {
    serde_json::from_value(json!({
        "type": "object",
        "properties": {
            "decision": {
                "type": "string",
                "title": title,
                "oneOf": [
                    {"const": APPROVE_ONCE, "title": "Allow once"},
                    {"const": APPROVE_SESSION, "title": "Allow for this session"},
                    {"const": APPROVE_DENY, "title": "Deny"}
                ]
            }
        },
        "required": ["decision"]
    }))
    .expect("the approval form is a valid elicitation schema")
}

/// The approval an `ElicitResult` gives (or why none came: the policy's fallback decides).
pub(crate) fn approval_of(r: Result<ElicitResult, NoAnswer>) -> Approval {
    match r {
        Ok(r) if r.action == ElicitationAction::Accept => match r
            .content
            .as_ref()
            .and_then(|c| c.get("decision"))
            .and_then(Value::as_str)
        {
            Some(APPROVE_ONCE) => Approval::Once,
            Some(APPROVE_SESSION) => Approval::Session,
            _ => Approval::Denied,
        },
        Ok(_) => Approval::Denied,
        Err(e) => Approval::Unavailable(e.to_string()),
    }
}

#[async_trait::async_trait]
impl Approver for ClientApprover {
    fn can_ask(&self) -> bool {
        self.0
            .supported_elicitation_modes()
            .contains(&rmcp::service::ElicitationMode::Form)
    }

    async fn ask(&self, request: &ApprovalRequest) -> Approval {
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: request.message(),
            requested_schema: approval_schema(request.title()),
        };
        approval_of(
            self.0
                .create_elicitation(params)
                .await
                .map_err(NoAnswer::from),
        )
    }
}

/// The client of a `run_python` request, as its proxied calls reach it: a server's question
/// goes to the user through this peer, and only while every running call is the same
/// identity's (stdio has one client, so one identity).
pub(super) struct PeerLink(rmcp::service::Peer<RoleServer>, Identity);

impl PeerLink {
    pub(super) fn new(peer: rmcp::service::Peer<RoleServer>, identity: Identity) -> PeerLink {
        PeerLink(peer, identity)
    }
}

#[async_trait::async_trait]
impl ClientLink for PeerLink {
    fn identity(&self) -> &Identity {
        &self.1
    }

    fn can_elicit(&self, request: &ElicitRequestParams) -> bool {
        use rmcp::service::ElicitationMode;
        let modes = self.0.supported_elicitation_modes();
        match request {
            ElicitRequestParams::FormElicitationParams { .. } => {
                modes.contains(&ElicitationMode::Form)
            }
            ElicitRequestParams::UrlElicitationParams { .. } => {
                modes.contains(&ElicitationMode::Url)
            }
            _ => false,
        }
    }

    async fn elicit(&self, request: ElicitRequestParams) -> Result<ElicitResult, NoAnswer> {
        Ok(self.0.create_elicitation(request).await?)
    }
}

/// An approver whose every question is a span of the call (`approval`, under the proxied
/// call, install or save that asks): how long the human took, and what they answered.
pub(super) struct TracedApprover(pub(super) std::sync::Arc<dyn Approver>);

#[async_trait::async_trait]
impl Approver for TracedApprover {
    fn can_ask(&self) -> bool {
        self.0.can_ask()
    }

    fn path(&self) -> &'static str {
        self.0.path()
    }

    async fn ask(&self, request: &ApprovalRequest) -> Approval {
        use bridge_core::trace::{self, Within as _};
        let mut attrs = vec![trace::Attr::new("mcp_code_bridge.ask.path", self.0.path())];
        match &request.asked {
            bridge_core::policy::Asked::ToolCall => {
                attrs.push(trace::Attr::new(
                    "mcp_code_bridge.server",
                    request.server.clone(),
                ));
                attrs.push(trace::Attr::new("gen_ai.tool.name", request.tool.clone()));
            }
            bridge_core::policy::Asked::Other { title, .. } => {
                attrs.push(trace::Attr::new("mcp_code_bridge.ask.title", *title));
            }
        }
        let span = trace::Guard::new(trace::internal("approval", attrs));
        let answer = self.0.ask(request).within(span.context().clone()).await;
        let said = match &answer {
            Approval::Once => "allow_once",
            Approval::Session => "allow_session",
            Approval::Denied => "denied",
            Approval::Unavailable(_) => "unavailable",
        };
        trace::set(
            span.context(),
            vec![trace::Attr::new("mcp_code_bridge.ask.answer", said)],
        );
        span.end(None);
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_approval_form_offers_three_choices() {
        let v = serde_json::to_value(approval_schema("Allow this tool call?")).unwrap();
        let choices: Vec<&str> = v["properties"]["decision"]["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["const"].as_str().unwrap())
            .collect();
        assert_eq!(choices, [APPROVE_ONCE, APPROVE_SESSION, APPROVE_DENY]);
        assert_eq!(v["required"], json!(["decision"]));
    }
}
