//! `runtime.fork()`: a session's snapshot kept as another session's, under the caller's
//! identity (`carry` keeps it, the session table checks the name is free).

use std::sync::Arc;

use serde_json::{Value, json};

use bridge_core::audit::StateEvent;
use bridge_core::config::Config;
use bridge_core::identity::SessionKey;
use bridge_core::protocol::{RpcFailure, RpcHandler};

use crate::carry::{self, Carry};
use crate::name::{check_session_name, shown};
use crate::session::Session;
use crate::table::Table;

/// `rpc` with `fork` answered here, for the calls of session `key`'s exec in `s`.
pub(crate) fn handler(
    table: &Arc<Table>,
    carry: &Arc<Carry>,
    config: &Arc<Config>,
    key: &SessionKey,
    s: &Arc<Session>,
    rpc: Arc<dyn RpcHandler>,
) -> Arc<dyn RpcHandler> {
    Arc::new(ForkRpc {
        table: Arc::clone(table),
        carry: Arc::clone(carry),
        config: Arc::clone(config),
        key: key.clone(),
        session: Arc::clone(s),
        inner: rpc,
    })
}

/// The `fork` RPC of `runtime.fork(name, reset=False)`: `{"session": name, "begin": true}`
/// first (is the target free, and how large may the snapshot be), then the snapshot's `snap`
/// frames (taken by the exec loop into the session), then `{"session": name}` to keep it as
/// `name`'s, under the caller's identity; with `"reset": true` in both, a session `name` that
/// exists is replaced. Any other method goes to `inner`.
struct ForkRpc {
    table: Arc<Table>,
    carry: Arc<Carry>,
    config: Arc<Config>,
    key: SessionKey,
    session: Arc<Session>,
    inner: Arc<dyn RpcHandler>,
}

impl ForkRpc {
    async fn fork(&self, params: &Value) -> Result<Value, String> {
        if !self.carry.keeps_snapshots() {
            return Err(if self.carry.max_size() == 0 {
                "snapshots are off (snapshot_max_size = 0), so sessions cannot be forked".into()
            } else {
                "this bridge keeps no session state (only `run` and `serve` do)".into()
            });
        }
        let name = params
            .get("session")
            .and_then(Value::as_str)
            .ok_or("fork needs a session name (a string)")?;
        check_session_name(name).map_err(|e| e.to_string())?;
        let to = SessionKey::new(self.key.owner().clone(), name);
        if to == self.key {
            return Err("a session cannot be forked into itself".into());
        }
        let begin = params
            .get("begin")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let reset = params
            .get("reset")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let exists = || {
            format!(
                "session {name:?} exists; fork into a new name, or replace it with runtime.fork({name:?}, reset=True)"
            )
        };
        if begin {
            // Forget a snapshot an earlier fork sent but never kept.
            drop(self.session.take_forked());
            if !reset && self.table.session_exists(&to).await {
                return Err(exists());
            }
            return Ok(json!({"limit": self.carry.max_size()}));
        }
        let t0 = std::time::Instant::now();
        let received = match self.session.take_forked() {
            Some(Ok(r)) => r,
            Some(Err(why)) => return Err(format!("the snapshot was not kept: {why}")),
            None => return Err("no snapshot arrived before the fork call".into()),
        };
        // Under `starting`, as a start is: no session of that name starts meanwhile.
        let _starting = self.table.counting().await;
        if reset {
            self.table
                .replace_for_fork(&to)
                .await
                .map_err(|e| e.to_string())?;
        } else if self.table.session_exists(&to).await {
            return Err(exists());
        }
        let config = Arc::clone(&self.config);
        let k = to.clone();
        let listing = tokio::task::spawn_blocking(move || received.keep(&config, &k, "fork"))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("the snapshot could not be stored: {e}"))?;
        let lost = listing.info.lost_names();
        let mut r = carry::record(
            &self.key,
            "fork",
            listing.size,
            lost.clone(),
            "ok",
            None,
            t0.elapsed(),
        );
        r.to = Some(name.to_string());
        self.carry.audit(StateEvent::Fork, r);
        tracing::info!(session = %shown(&self.key), to = %shown(&to), bytes = listing.size, "forked the session");
        Ok(json!({"session": name, "size": listing.size, "lost": lost}))
    }
}

#[async_trait::async_trait]
impl RpcHandler for ForkRpc {
    async fn handle(&self, method: &str, params: Value) -> Result<Value, RpcFailure> {
        if method == "fork" {
            return self.fork(&params).await.map_err(RpcFailure::from);
        }
        self.inner.handle(method, params).await
    }

    fn on_interpreter(&self, interpreter: &bridge_core::protocol::Interpreter) {
        self.inner.on_interpreter(interpreter);
    }
}
