//! MCP over stdin and stdout, one JSON-RPC message per line.
//!
//! The bridge's own transport rather than rmcp's, for two things rmcp's cannot do:
//! - a line that is not a JSON-RPC message is answered: `-32700` (not JSON) or `-32600` (JSON,
//!   but no message the bridge knows), with what was wrong, so a client that wrote it learns
//!   why nothing else came back. rmcp drops such a line (rust-sdk#938, for fear of an error
//!   storm with a peer that echoes errors): these answers are rate-limited instead;
//! - the 2025-11-25 task requests are translated before rmcp parses them
//!   ([`crate::legacy_tasks`]).
//!
//! Every line is bounded ([`crate::MAX_REQUEST_LINE_BYTES`]): a longer one is read
//! through to its newline without being kept, and answered `-32600`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use rmcp::RoleServer;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use crate::legacy_tasks::Wire;

/// How many error answers a burst may have, and how many a second follow it.
const ANSWER_BURST: f64 = 20.0;
const ANSWERS_PER_SEC: f64 = 5.0;

/// The bridge's end of a stdio connection: `R` is its stdin, `W` its stdout.
pub struct StdioTransport<R, W> {
    input: R,
    line: Vec<u8>,
    partial: Partial,
    max_line: usize,
    out: Arc<tokio::sync::Mutex<W>>,
    wire: Arc<Mutex<Wire>>,
    answers: Bucket,
    refused: u64,
}

impl StdioTransport<tokio::io::BufReader<tokio::io::Stdin>, tokio::io::Stdout> {
    /// The process's own stdin and stdout.
    pub fn process(max_line: usize) -> Self {
        StdioTransport::new(
            tokio::io::BufReader::new(tokio::io::stdin()),
            tokio::io::stdout(),
            max_line,
        )
    }
}

impl<R, W> StdioTransport<R, W> {
    /// Messages read from `input` and written to `output`; a line longer than `max_line` bytes
    /// is read through and answered `-32600`.
    pub fn new(input: R, output: W, max_line: usize) -> Self {
        StdioTransport {
            input,
            line: Vec::new(),
            partial: Partial::default(),
            max_line,
            out: Arc::new(tokio::sync::Mutex::new(output)),
            wire: Arc::new(Mutex::new(Wire::new())),
            answers: Bucket::new(),
            refused: 0,
        }
    }
}

/// Where the line being read stands.
#[derive(Default)]
struct Partial {
    /// Some bytes of it were read.
    any: bool,
    /// It is over `max_line`: the rest is read through, not kept.
    too_long: bool,
    /// It was handed out; the next read starts a new one.
    complete: bool,
}

/// What one line turned out to be.
enum Line {
    Message(Box<RxJsonRpcMessage<RoleServer>>),
    /// Nothing to do (blank, or a broken message that must not be answered).
    Skip,
    /// An error answer: code, what was wrong, the id it answers (JSON null when unknown).
    Refuse(i64, String, Value),
}

impl<R, W> StdioTransport<R, W>
where
    R: AsyncBufRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// Read one line into `self.line`, up to `max_line` bytes. `Ok(None)` at the end of input;
    /// `Ok(Some(false))` for a line that was too long (read through, not kept).
    ///
    /// Cancel-safe, as rmcp's service loop needs (it selects over `receive`): a line read in
    /// part stays in `self` and the next call goes on with it.
    async fn read_line(&mut self) -> std::io::Result<Option<bool>> {
        if std::mem::take(&mut self.partial.complete) {
            self.line.clear();
            self.partial = Partial::default();
        }
        loop {
            let buf = self.input.fill_buf().await?;
            if buf.is_empty() {
                self.partial.complete = true;
                return Ok(self.partial.any.then_some(!self.partial.too_long));
            }
            self.partial.any = true;
            let (chunk, done) = match memchr(buf) {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            if !self.partial.too_long && self.line.len() + chunk.len() <= self.max_line {
                self.line.extend_from_slice(chunk);
            } else {
                self.partial.too_long = true;
                self.line = Vec::new();
            }
            let used = done.unwrap_or(buf.len());
            self.input.consume(used);
            if done.is_some() {
                self.partial.complete = true;
                return Ok(Some(!self.partial.too_long));
            }
        }
    }

    fn classify(&mut self, fits: bool) -> Line {
        if !fits {
            return Line::Refuse(
                -32600,
                format!(
                    "Invalid Request: a line of more than {} MiB; the bridge reads one JSON-RPC \
                     message of at most that size per line (a larger `code` should be a file \
                     given with `inputs`)",
                    self.max_line >> 20
                ),
                Value::Null,
            );
        }
        let text = self.line.trim_ascii();
        if text.is_empty() {
            return Line::Skip;
        }
        let mut value: Value = match serde_json::from_slice(text) {
            Ok(v) => v,
            Err(e) => {
                return Line::Refuse(
                    -32700,
                    format!(
                        "Parse error: the line is not JSON ({e}); each line on the bridge's \
                         stdin must be one JSON-RPC message"
                    ),
                    Value::Null,
                );
            }
        };
        self.wire.lock().unwrap().inbound(&mut value);
        let id = value.get("id").cloned();
        let is_notification = id.is_none() && value.get("method").is_some();
        let is_answer = value.get("result").is_some() || value.get("error").is_some();
        match serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(value) {
            Ok(m) => Line::Message(Box::new(m)),
            Err(e) if is_notification || is_answer => {
                // Neither is answered in JSON-RPC: say it in the log instead.
                self.note(&format!(
                    "a {} the bridge cannot read ({e})",
                    if is_answer { "reply" } else { "notification" }
                ));
                Line::Skip
            }
            Err(e) => {
                let id = id.filter(|i| i.is_string() || i.is_i64() || i.is_u64());
                Line::Refuse(
                    -32600,
                    format!(
                        "Invalid Request: not a JSON-RPC 2.0 request the bridge knows ({e}); \
                         send one object with \"jsonrpc\": \"2.0\", \"id\", \"method\" and \
                         \"params\" per line (batches are not supported)"
                    ),
                    id.unwrap_or(Value::Null),
                )
            }
        }
    }

    /// Log a refused line: the first few, then sparsely, so a client spewing garbage cannot
    /// flood the log.
    fn note(&mut self, what: &str) {
        self.refused += 1;
        if self.refused <= 10 || self.refused.is_power_of_two() {
            tracing::warn!(
                refused = self.refused,
                "stdin: {what}; is something other than the MCP client writing to the bridge's stdin?"
            );
        }
    }

    async fn refuse(&mut self, code: i64, message: String, id: Value) {
        self.note(&message);
        if !self.answers.take() {
            return;
        }
        let answer =
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
        let _ = write_line(&self.out, &answer).await;
    }
}

impl<R, W> Transport<RoleServer> for StdioTransport<R, W>
where
    R: AsyncBufRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let out = self.out.clone();
        let wire = self.wire.clone();
        async move {
            // The writer first, as rmcp's own transport does: messages go out in the order their
            // sends began.
            let mut out = out.lock().await;
            let mut bytes = {
                let mut wire = wire.lock().unwrap();
                if wire.awaits_answers() {
                    let mut v = serde_json::to_value(&item)?;
                    wire.outbound(&mut v);
                    serde_json::to_vec(&v)?
                } else {
                    serde_json::to_vec(&item)?
                }
            };
            bytes.push(b'\n');
            out.write_all(&bytes).await?;
            out.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let fits = match self.read_line().await {
                Ok(Some(fits)) => fits,
                Ok(None) => return None,
                Err(e) => {
                    tracing::warn!("stdin: {e}; the connection ends");
                    return None;
                }
            };
            match self.classify(fits) {
                Line::Message(m) => return Some(*m),
                Line::Skip => {}
                Line::Refuse(code, message, id) => self.refuse(code, message, id).await,
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.out.lock().await.flush().await
    }
}

async fn write_line<W: AsyncWrite + Unpin>(
    out: &tokio::sync::Mutex<W>,
    v: &Value,
) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(v)?;
    bytes.push(b'\n');
    let mut out = out.lock().await;
    out.write_all(&bytes).await?;
    out.flush().await
}

fn memchr(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n')
}

/// A token bucket for error answers: a peer that echoes every error back cannot turn the two
/// ends into a storm.
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new() -> Bucket {
        Bucket {
            tokens: ANSWER_BURST,
            at: Instant::now(),
        }
    }

    fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * ANSWERS_PER_SEC;
        self.tokens = (self.tokens + refill).min(ANSWER_BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn run(input: &[u8], max_line: usize) -> (Vec<String>, Vec<Value>) {
        let (mut client, server_out) = tokio::io::duplex(1 << 20);
        let mut t = StdioTransport::new(
            tokio::io::BufReader::new(std::io::Cursor::new(input.to_vec())),
            server_out,
            max_line,
        );
        let mut got = Vec::new();
        while let Some(m) = t.receive().await {
            let v = serde_json::to_value(&m).unwrap();
            got.push(v["method"].as_str().unwrap_or("").to_string());
        }
        drop(t);
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut client, &mut text)
            .await
            .unwrap();
        let answers = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (got, answers)
    }

    #[tokio::test]
    async fn bad_lines_are_answered_and_reading_goes_on() {
        let input = b"hello\n\n  \n{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/list\"}\n\
            [1,2]\n{\"jsonrpc\":\"2.0\",\"id\":\"a\"}\n\
            {\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":7}\n\
            \xff\xfe\n{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"ping\"}";
        let (got, answers) = run(input, 1 << 20).await;
        assert_eq!(got, ["tools/list", "ping"]);
        let codes: Vec<(i64, Value)> = answers
            .iter()
            .map(|a| (a["error"]["code"].as_i64().unwrap(), a["id"].clone()))
            .collect();
        assert_eq!(
            codes,
            [
                (-32700, Value::Null),
                (-32600, Value::Null),
                (-32600, json!("a")),
                (-32700, Value::Null),
            ]
        );
        let first = answers[0]["error"]["message"].as_str().unwrap();
        assert!(
            first.contains("not JSON") && first.contains("one JSON-RPC message"),
            "{first}"
        );
    }

    #[tokio::test]
    async fn a_line_over_the_limit_is_refused_without_being_kept() {
        let mut input = vec![b'{'; 5000];
        input.extend_from_slice(b"\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n");
        let (got, answers) = run(&input, 1024).await;
        assert_eq!(got, ["ping"]);
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0]["error"]["code"], -32600);
        assert!(
            answers[0]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("a line of more than")
        );
    }

    #[tokio::test]
    async fn error_answers_are_rate_limited() {
        let input = b"x\n".repeat(1000);
        let (got, answers) = run(&input, 1024).await;
        assert!(got.is_empty());
        assert!(
            (ANSWER_BURST as usize..ANSWER_BURST as usize + 5).contains(&answers.len()),
            "{}",
            answers.len()
        );
    }

    /// A `receive` dropped halfway through a line (rmcp selects over it) loses nothing: the
    /// next one goes on with the same line.
    #[tokio::test]
    async fn a_receive_cancelled_mid_line_loses_nothing() {
        let (mut client, input) = tokio::io::duplex(1 << 16);
        let (_out_reader, out) = tokio::io::duplex(1 << 16);
        let mut t = StdioTransport::new(tokio::io::BufReader::new(input), out, 1 << 20);
        use tokio::io::AsyncWriteExt as _;
        client
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,")
            .await
            .unwrap();
        let first = tokio::time::timeout(Duration::from_millis(100), t.receive()).await;
        assert!(first.is_err(), "half a line is no message");
        client.write_all(b"\"method\":\"ping\"}\n").await.unwrap();
        let m = tokio::time::timeout(Duration::from_secs(5), t.receive())
            .await
            .expect("the rest of the line completes it")
            .expect("the whole line");
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["method"], "ping");
        assert_eq!(v["id"], 1);
    }

    #[test]
    fn the_bucket_refills() {
        let mut b = Bucket::new();
        while b.take() {}
        b.at -= Duration::from_secs(1);
        assert!(b.take());
    }
}
