//! A raw JSON-RPC client over a child's stdio (exact bytes, no client library in the timing).

use super::*;

pub(crate) struct Raw {
    pub(crate) child: Child,
    pub(crate) stdin: ChildStdin,
    pub(crate) lines: tokio::io::Lines<BufReader<ChildStdout>>,
    pub(crate) next: u64,
}

impl Raw {
    pub(crate) fn spawn(mut cmd: Command) -> Res<Raw> {
        let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Ok(Raw {
            child,
            stdin,
            lines,
            next: 1,
        })
    }

    pub(crate) async fn send(&mut self, msg: Value) -> Res<()> {
        let mut line = serde_json::to_vec(&msg).unwrap();
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .await
            .map_err(|e| format!("write: {e}"))?;
        self.stdin.flush().await.map_err(|e| format!("flush: {e}"))
    }

    /// Send a request and return its `result`.
    pub(crate) async fn request(&mut self, method: &str, params: Value) -> Res<Value> {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        let wait = async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .map_err(|e| format!("read: {e}"))?
                    .ok_or_else(|| format!("stdout closed before the reply to {method}"))?;
                let Ok(msg) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if msg.get("method").is_some() {
                    if let Some(rid) = msg.get("id") {
                        // A request from the server (roots/list...): we offer nothing.
                        let rid = rid.clone();
                        self.send(json!({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "not supported"}}))
                            .await?;
                    }
                    continue;
                }
                if msg.get("id") == Some(&json!(id)) {
                    if let Some(e) = msg.get("error") {
                        return Err(format!("{method} failed: {e}"));
                    }
                    return Ok(msg["result"].clone());
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .map_err(|_| format!("no reply to {method} within 60s"))?
    }

    pub(crate) async fn initialize(&mut self) -> Res<Value> {
        let r = self
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "mcp-code-bridge-bench", "version": "1"}}),
            )
            .await?;
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        Ok(r)
    }

    /// Close stdin and wait for the process to exit (killing it after 30 s).
    pub(crate) async fn close(mut self) {
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}
