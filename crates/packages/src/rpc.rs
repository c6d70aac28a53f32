//! The packages' RPC methods (`docs/protocol.md`), answered in front of an exec's other
//! handlers: `install` and `installed` here, every other method passed on unchanged.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::decide::Asker;
use super::error::PackageError;
use super::installer::Packages;
use bridge_core::error::Hinted;
use bridge_core::identity::SessionKey;
use bridge_core::policy::Approver;
use bridge_core::protocol::{Interpreter, RpcFailure, RpcHandler};

/// The `kind` of a failed install: the runtime raises `PackageError`, an `McpError`.
pub const RPC_PACKAGE: &str = "package";
/// The `kind` of a refused install: the runtime raises `PackageDenied`, a `PermissionError`.
pub const RPC_PACKAGE_DENIED: &str = "package_denied";

/// An exec's RPC handler with the packages' methods in front of `inner`.
pub struct PackagesRpc {
    packages: Arc<Packages>,
    key: SessionKey,
    approver: Option<Arc<dyn Approver>>,
    interpreter: Mutex<Option<Interpreter>>,
    inner: Arc<dyn RpcHandler>,
}

impl PackagesRpc {
    /// `inner` with `install` and `installed` answered in front of it, for the session `key`
    /// (its installs go into the interpreter the exec runs in), asking `approver` when
    /// `[packages]` says to ask; `None`: no one can be asked.
    pub fn wrap(
        packages: Arc<Packages>,
        key: SessionKey,
        approver: Option<Arc<dyn Approver>>,
        inner: Arc<dyn RpcHandler>,
    ) -> Arc<dyn RpcHandler> {
        Arc::new(PackagesRpc {
            packages,
            key,
            approver,
            interpreter: Mutex::new(None),
            inner,
        })
    }

    fn current(&self) -> Interpreter {
        self.interpreter.lock().unwrap().clone().unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl RpcHandler for PackagesRpc {
    async fn handle(&self, method: &str, params: Value) -> Result<Value, RpcFailure> {
        match method {
            "install" => {
                let requirements: Vec<String> = match params.get("requirements") {
                    Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
                        .iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect(),
                    _ => {
                        return Err(RpcFailure {
                            message: "install needs \"requirements\", a list of strings".into(),
                            kind: Some(RPC_PACKAGE),
                        });
                    }
                };
                let who = Asker {
                    key: &self.key,
                    approver: self.approver.as_ref(),
                    preinstall: false,
                };
                match self
                    .packages
                    .install(&self.current(), &requirements, who)
                    .await
                {
                    Ok(done) => Ok(json!({"installed": done.iter().map(|i| json!({
                        "name": i.name, "version": i.version, "cached": i.cached, "size": i.size,
                    })).collect::<Vec<_>>()})),
                    Err(e) => Err(RpcFailure {
                        message: {
                            if matches!(e, PackageError::Io { .. } | PackageError::Resolver { .. })
                            {
                                tracing::warn!("an install failed: {}", e.message());
                            }
                            e.for_sandbox()
                        },
                        kind: Some(if e.is_refusal() {
                            RPC_PACKAGE_DENIED
                        } else {
                            RPC_PACKAGE
                        }),
                    }),
                }
            }
            "installed" => {
                let list = self.packages.installed(&self.current());
                Ok(json!({"installed": list.iter().map(|i| json!({
                    "name": i.name, "version": i.version, "requested": i.requested,
                })).collect::<Vec<_>>()}))
            }
            _ => self.inner.handle(method, params).await,
        }
    }

    fn on_interpreter(&self, interpreter: &Interpreter) {
        *self.interpreter.lock().unwrap() = Some(interpreter.clone());
        self.inner.on_interpreter(interpreter);
    }
}
