//! Binding an exec to the servers it loads ([`Upstreams::load_for`]): the names resolved once,
//! each server started and its tool list hydrated, every tool's metadata marked with what the
//! policy says of it, and the exec's RPC handler made over the loaded servers' pool slots.

use std::sync::Arc;

use bridge_core::boxed::Boxed;
use bridge_core::protocol::{CatalogInfo, ExecBinding, LoadedServer};

use super::pool::{CatalogMeta, Slot};
use super::report::BindError;
use super::rpc::ExecRpc;
use super::upstreams::{CallContext, Upstreams};

impl Upstreams {
    /// [`Upstreams::load_for`] with no session and no client to ask (`exec`): a call the
    /// policy says to ask about gets `ask_fallback`.
    #[inline(never)]
    pub fn load<'a>(&'a self, loaded: &'a [String]) -> Boxed<'a, Result<ExecBinding, BindError>> {
        self.load_for(loaded, CallContext::default())
    }

    /// Prepare an exec that loads `loaded`: resolve the names (server names or aliases) once,
    /// start those servers and hydrate their tool lists (concurrently). The exec's RPC handler
    /// keeps their slots, and applies the policy to every proxied call for `call`'s session.
    /// Each tool's metadata says whether the policy asks before calling it or refuses it.
    #[inline(never)]
    pub fn load_for<'a>(
        &'a self,
        loaded: &'a [String],
        call: CallContext,
    ) -> Boxed<'a, Result<ExecBinding, BindError>> {
        Box::pin(self.load_for_here(loaded, call))
    }

    async fn load_for_here(
        &self,
        loaded: &[String],
        call: CallContext,
    ) -> Result<ExecBinding, BindError> {
        let mut slots: Vec<Arc<Slot>> = Vec::new();
        let mut unknown = Vec::new();
        for name in loaded {
            match self.lookup(name) {
                Some(slot) => {
                    if !slots.iter().any(|s| Arc::ptr_eq(s, slot)) {
                        slots.push(slot.clone());
                    }
                }
                None => unknown.push(name.clone()),
            }
        }
        if !unknown.is_empty() {
            return Err(BindError::UnknownServers {
                names: unknown,
                known: self.known(),
            });
        }
        let results = futures::future::join_all(slots.iter().map(|s| self.server_tools(s))).await;
        let mut servers = Vec::with_capacity(slots.len());
        let mut errors = Vec::new();
        for (slot, r) in slots.iter().zip(results) {
            let info = &slot.info;
            match r {
                Ok(tools) => servers.push(LoadedServer {
                    name: info.name.clone(),
                    alias: info.alias.clone(),
                    description: info.description.clone(),
                    cwd: info.cwd.clone(),
                    tools: self.mark_policy(slot, tools.into_tool_meta()),
                    catalog: catalog_info(&slot.catalog.meta()),
                }),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(BindError::Unavailable(errors));
        }
        let rpc = ExecRpc::new(self.clone(), slots, call);
        Ok(ExecBinding {
            servers,
            discovered: self.discovered(),
            rpc: Arc::new(rpc),
            skills: false,
        })
    }

    /// Set each tool's `policy` to `ask` or `deny` when the policy says so (before any grant:
    /// what the model plans with is the rule, not a session's answers), and, with flows on, its
    /// `flows` labels and guarded arguments.
    fn mark_policy(
        &self,
        slot: &Slot,
        mut tools: Vec<bridge_core::protocol::ToolMeta>,
    ) -> Vec<bridge_core::protocol::ToolMeta> {
        let policy = self.policy();
        let flows = self.flows().rules();
        if policy.allows_everything() && !flows.is_on() {
            return tools;
        }
        let listed = slot.cached_tools();
        for t in &mut tools {
            let annotations = listed
                .as_ref()
                .and_then(|l| l.iter().find(|x| x.name == t.name))
                .and_then(|x| x.annotations.as_ref());
            let destructive = bridge_core::policy::annotated_destructive(annotations);
            let action = policy.rule_for(slot.name(), &t.name, destructive).action;
            t.policy = (action != bridge_core::config::policy::Action::Allow)
                .then(|| action.as_str().to_string());
            let labels = flows.labels(slot.name(), &t.name, annotations);
            if !labels.names().is_empty() {
                let guarded = match (&labels.guarded, labels.checked()) {
                    (_, false) => serde_json::Value::Null,
                    (Some(args), true) => serde_json::json!(args),
                    (None, true) => serde_json::json!("all"),
                };
                // Where each label came from: a glob (and its file) or an annotation.
                let from: serde_json::Map<String, serde_json::Value> = [
                    ("untrusted", &labels.untrusted),
                    ("private", &labels.private),
                    ("acting", &labels.acting),
                    ("open", &labels.open),
                ]
                .into_iter()
                .filter_map(|(k, why)| Some((k.to_string(), serde_json::json!(why.as_ref()?))))
                .collect();
                t.flows = Some(serde_json::json!({
                    "labels": labels.names(),
                    "guarded": guarded,
                    "from": from,
                }));
            }
        }
        tools
    }
}

/// What `describe_server()` shows of a list's age.
fn catalog_info(meta: &CatalogMeta) -> Option<CatalogInfo> {
    Some(CatalogInfo {
        updated_at: meta.updated_at?,
        source: if meta.from_file { "catalog" } else { "live" }.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection;
    use crate::pool::CallError;
    use crate::upstreams::tests::ups;
    use bridge_core::error::Hinted as _;

    #[tokio::test]
    async fn bind_rejects_unknown_names_listing_the_known_ones() {
        let u = ups(&["alpha", "beta"]);
        let e = u.load(&["gamma".into()]).await.err().unwrap();
        assert!(
            matches!(&e, BindError::UnknownServers { names, known } if names == &["gamma"] && known == &["alpha", "beta"]),
            "{e}"
        );
        assert_eq!(
            e.message(),
            "Unknown MCP server 'gamma'; known servers: alpha, beta"
        );
        let e = u
            .load(&["gamma".into(), "delta".into()])
            .await
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("Unknown MCP servers 'gamma', 'delta'"),
            "{e}"
        );
        let e = ups(&[]).load(&["x".into()]).await.err().unwrap();
        assert!(
            e.hint()
                .unwrap()
                .text()
                .contains("no MCP servers are configured"),
            "{e}"
        );
        // A server that cannot start is named with the reason.
        let e = u.load(&["alpha".into()]).await.err().unwrap();
        let BindError::Unavailable(errors) = &e else {
            panic!("{e}")
        };
        assert!(
            matches!(
                errors.as_slice(),
                [CallError::Start(connection::StartError::CommandNotFound { server, .. })] if server == "alpha"
            ),
            "{e}"
        );
        // The text the model gets joins each error with its advice.
        let text = u.load(&["alpha".into()]).await.err().unwrap().message();
        assert!(
            text.contains("'alpha'") && text.contains("not found (is it installed"),
            "{text}"
        );
    }
}
