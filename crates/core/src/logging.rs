//! Logging: `tracing` to stderr only (stdout is the MCP channel); what others may put into it
//! (the sandbox, upstream servers, child processes), bounded in lines and bytes; and a helper
//! that turns a child's stderr into log lines.

use std::time::{Duration, Instant};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, BufReader};
use tracing_subscriber::EnvFilter;

use crate::boxed::Boxed;
use crate::config::LogLevel;

/// The library names of this project's crates: the log targets `log_level` applies to (a
/// target is its module path, `bridge_sandbox::park`, and a directive matches by prefix).
pub const CRATES: &[&str] = &[
    "mcp_code_bridge",
    "bridge_core",
    "bridge_packages",
    "bridge_skills",
    "bridge_sandbox",
    "bridge_upstream",
    "bridge_server",
];

/// The filter when `RUST_LOG` is not set: `level` for this project's crates, warnings of others.
pub fn default_filter(level: LogLevel) -> String {
    let mut filter = "warn,rmcp=warn".to_string();
    for krate in CRATES {
        filter.push_str(&format!(",{krate}={}", level.as_filter()));
    }
    filter
}

/// Install the stderr subscriber. `RUST_LOG` refines the level when set.
pub fn init(level: LogLevel) {
    let filter = EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| EnvFilter::new(default_filter(level)));
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false);
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::filter::filter_fn(|meta| {
            !is_rmcp_error_reply(meta)
        }))
        .with(QuietGoneClients)
        .with(fmt)
        .try_init();
}

/// Leaves out rmcp's ERROR that an answer could not be sent because its receiver is gone
/// ("channel closed"): under 2026-07-28 an HTTP request has its own one-shot channel, a client
/// cancels by closing its connection, and rmcp then still sends the cancelled handler's answer
/// into the closed channel and logs an ERROR for every cancel. The call's cancellation is in
/// the audit log and the result; other send failures (a broken stdout, say) are still logged.
struct QuietGoneClients;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for QuietGoneClients {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        !is_send_to_gone_receiver(event)
    }
}

/// rmcp's messages for an answer it could not send (`service.rs`), whose `error` is a closed
/// channel, the one-shot transport of a request without a session.
const UNSENT_ANSWER: [&str; 2] = [
    "failed to send pending response during drain",
    "fail to response message",
];

fn is_send_to_gone_receiver(event: &tracing::Event<'_>) -> bool {
    let meta = event.metadata();
    if *meta.level() != tracing::Level::ERROR || !meta.target().starts_with("rmcp::service") {
        return false;
    }
    #[derive(Default)]
    struct Fields {
        message: String,
        error: String,
    }
    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            match field.name() {
                "message" => self.message = format!("{value:?}"),
                "error" => self.error = format!("{value:?}"),
                _ => {}
            }
        }
    }
    let mut f = Fields::default();
    event.record(&mut f);
    UNSENT_ANSWER.contains(&f.message.as_str()) && f.error.ends_with("channel closed")
}

/// rmcp's "response error" event: every error reply, at WARN, as the error's Rust `Debug` form.
/// The bridge logs its own readable line for each error it answers (`server::refused`), so
/// this one is left out. Recognised by its fields (`id` and `error`), which no other WARN event
/// of rmcp's service loop carries together.
fn is_rmcp_error_reply(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_event()
        && *meta.level() == tracing::Level::WARN
        && meta.target().starts_with("rmcp::service")
        && meta.fields().field("id").is_some()
        && meta.fields().field("error").is_some()
}

/// The window of a [`LogBudget`].
const LOG_WINDOW: Duration = Duration::from_secs(60);
/// The longest line a child's stderr makes the bridge read at once (a longer one comes in pieces).
pub const MAX_LINE: usize = 2000;
/// Lines per minute another process's stderr or log notifications may put into the log.
pub const PROCESS_LINES_PER_MINUTE: u32 = 60;

/// Lines a source others control (the sandbox, an upstream server, a child process) may put
/// into the bridge's log per minute; the rest are counted, and the count is logged when the
/// next minute opens. So no source can make the log grow faster than its budget.
pub struct LogBudget {
    what: &'static str,
    per_window: u32,
    window_start: Option<Instant>,
    used: u32,
    suppressed: u64,
}

impl LogBudget {
    /// `what` names the lines in the count's message ("lines from the sandbox").
    pub const fn new(what: &'static str, per_minute: u32) -> LogBudget {
        LogBudget {
            what,
            per_window: per_minute,
            window_start: None,
            used: 0,
            suppressed: 0,
        }
    }

    /// Whether one more line of `source` may be logged now.
    pub fn allow(&mut self, source: &str) -> bool {
        let now = Instant::now();
        if self
            .window_start
            .is_none_or(|t| now.duration_since(t) >= LOG_WINDOW)
        {
            if self.suppressed > 0 {
                tracing::warn!(
                    %source,
                    suppressed = self.suppressed,
                    "more {} were not logged (at most {} a minute)",
                    self.what,
                    self.per_window
                );
            }
            self.window_start = Some(now);
            self.used = 0;
            self.suppressed = 0;
        }
        if self.used < self.per_window {
            self.used += 1;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }
}

/// The next line of `reader`, of at most `max` bytes (a longer line comes as pieces of `max`),
/// lossily UTF-8, without its newline; `None` at the end or on an error. What a child writes
/// without a newline never makes the bridge hold more than `max` bytes.
#[inline(never)]
pub fn next_line<'a, R: AsyncBufRead + Unpin + Send>(
    reader: &'a mut R,
    max: usize,
) -> Boxed<'a, Option<String>> {
    Box::pin(read_line(reader, max))
}

/// [`next_line`]'s body, compiled once here whatever the reader.
async fn read_line(reader: &mut (dyn AsyncBufRead + Unpin + Send), max: usize) -> Option<String> {
    use tokio::io::AsyncReadExt as _;
    let mut buf = Vec::new();
    match reader.take(max as u64).read_until(b'\n', &mut buf).await {
        Ok(0) | Err(_) => None,
        Ok(_) => {
            if buf.last() == Some(&b'\n') {
                buf.pop();
            }
            Some(String::from_utf8_lossy(&buf).into_owned())
        }
    }
}

/// Log each line a child writes (its stderr), tagged with `source`, within
/// [`PROCESS_LINES_PER_MINUTE`]; long lines are cut into pieces. With a [`LineTail`], its last
/// lines are also kept there, logged or not, for an error message to quote. Ends when `reader`
/// does (or fails).
#[inline(never)]
pub fn forward_lines<'a, R: AsyncRead + Unpin + Send + 'a>(
    reader: R,
    source: String,
    tail: Option<LineTail>,
) -> Boxed<'a, ()> {
    Box::pin(forward(Box::new(reader), source, tail))
}

/// [`forward_lines`]'s body, compiled once here whatever the reader.
async fn forward(
    reader: Box<dyn AsyncRead + Unpin + Send + '_>,
    source: String,
    tail: Option<LineTail>,
) {
    let mut reader = BufReader::new(reader);
    let mut budget = LogBudget::new("lines from this process", PROCESS_LINES_PER_MINUTE);
    while let Some(line) = read_line(&mut reader, MAX_LINE).await {
        if let Some(tail) = &tail {
            tail.push(&line);
        }
        if budget.allow(&source) {
            tracing::info!(source = %source, "{line}");
        }
    }
}

/// The last [`LineTail::LINES`] lines a child wrote (each at most [`LineTail::LINE_CHARS`]
/// characters, made visible), shared between the task that reads them and the code that quotes
/// them when the child fails.
#[derive(Clone, Default)]
pub struct LineTail(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>);

impl LineTail {
    /// How many lines are kept.
    pub const LINES: usize = 5;
    /// How many characters of each line are kept.
    pub const LINE_CHARS: usize = 300;

    fn push(&self, line: &str) {
        let line: String = crate::text::visible(line)
            .chars()
            .take(Self::LINE_CHARS)
            .collect();
        let mut lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if lines.len() == Self::LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The kept lines, oldest first, joined by " | "; empty when the child wrote nothing.
    pub fn joined(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        lines
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every crate of the workspace is in `CRATES` by its library name, so `log_level` reaches
    /// its log lines (a crate left out would log warnings only).
    #[test]
    fn the_default_filter_names_every_crate_of_the_workspace() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap();
        let mut seen = 0;
        for entry in std::fs::read_dir(crates).unwrap().flatten() {
            let Ok(manifest) = std::fs::read_to_string(entry.path().join("Cargo.toml")) else {
                continue;
            };
            let name = manifest
                .split("[lib]")
                .nth(1)
                .and_then(|lib| lib.lines().find_map(|l| l.trim().strip_prefix("name = \"")))
                .map(|n| n.trim_end_matches('"'))
                .unwrap_or_else(|| panic!("{}: no [lib] name", entry.path().display()));
            assert!(CRATES.contains(&name), "{name} is not in logging::CRATES");
            seen += 1;
        }
        assert_eq!(
            seen,
            CRATES.len() - 1,
            "the top crate and one per crates/ directory"
        );
        let filter = default_filter(LogLevel::Debug);
        for krate in CRATES {
            assert!(filter.contains(&format!(",{krate}=debug")), "{filter}");
        }
        assert!(filter.starts_with("warn,rmcp=warn,"), "{filter}");
    }

    /// A tail keeps the last lines, each cut and made visible, and the forwarder fills it.
    #[tokio::test]
    async fn a_line_tail_keeps_the_last_lines_cut_and_visible() {
        let tail = LineTail::default();
        assert_eq!(tail.joined(), "");
        let mut text = String::new();
        for i in 0..7 {
            text.push_str(&format!("line {i}\n"));
        }
        text.push_str(&"x".repeat(1000));
        text.push_str("\n\u{1b}[31mred\n");
        forward_lines(text.as_bytes(), "test".into(), Some(tail.clone())).await;
        let joined = tail.joined();
        let lines: Vec<&str> = joined.split(" | ").collect();
        assert_eq!(lines.len(), LineTail::LINES, "{joined}");
        assert_eq!(lines[0], "line 4");
        assert_eq!(lines[3].len(), LineTail::LINE_CHARS);
        assert!(!lines[4].contains('\u{1b}'), "{joined}");
        assert!(lines[4].ends_with("red"), "{joined}");
    }

    /// rmcp's ERROR for an answer whose client is gone is left out; its other errors, and the
    /// same message with another cause, are kept.
    #[test]
    fn an_answer_to_a_gone_client_is_not_an_error_line() {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::layer::SubscriberExt as _;
        #[derive(Clone, Default)]
        struct Seen(Arc<Mutex<Vec<String>>>);
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
            fn on_event(
                &self,
                event: &tracing::Event<'_>,
                _ctx: tracing_subscriber::layer::Context<'_, S>,
            ) {
                let mut v = String::new();
                struct V<'a>(&'a mut String);
                impl tracing::field::Visit for V<'_> {
                    fn record_debug(
                        &mut self,
                        f: &tracing::field::Field,
                        value: &dyn std::fmt::Debug,
                    ) {
                        if f.name() == "message" {
                            *self.0 = format!("{value:?}");
                        }
                    }
                }
                event.record(&mut V(&mut v));
                self.0.lock().unwrap().push(v);
            }
        }
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry()
            .with(QuietGoneClients)
            .with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            let closed = "Transport [rmcp::transport::OneshotTransport] error: channel closed";
            tracing::error!(target: "rmcp::service", error = %closed, "failed to send pending response during drain");
            tracing::error!(target: "rmcp::service", error = %closed, "fail to response message");
            tracing::error!(target: "rmcp::service", error = %"Broken pipe (os error 32)", "failed to send pending response during drain");
            tracing::error!(target: "rmcp::service", error = %closed, "response send task failed");
            tracing::error!(target: "mcp_code_bridge", error = %closed, "fail to response message");
        });
        assert_eq!(
            *seen.0.lock().unwrap(),
            [
                "failed to send pending response during drain",
                "response send task failed",
                "fail to response message"
            ]
        );
    }

    #[tokio::test]
    async fn lines_are_bounded_and_split() {
        let mut input = vec![b'a'; 5000];
        input.extend_from_slice(b"\nshort\n\xff end");
        let mut r = BufReader::new(std::io::Cursor::new(input));
        let mut got = Vec::new();
        while let Some(l) = next_line(&mut r, 2000).await {
            got.push(l);
        }
        let lens: Vec<usize> = got.iter().map(String::len).collect();
        assert_eq!(lens[..3], [2000, 2000, 1000]);
        assert_eq!(got[3], "short");
        assert_eq!(got[4], "\u{fffd} end");
        assert_eq!(got.len(), 5);
    }

    #[test]
    fn the_budget_counts_what_it_refuses() {
        let mut b = LogBudget::new("lines", 3);
        let allowed = (0..10).filter(|_| b.allow("x")).count();
        assert_eq!(allowed, 3);
        assert_eq!(b.suppressed, 7);
        b.window_start = Some(Instant::now() - LOG_WINDOW);
        assert!(b.allow("x"));
        assert_eq!(b.suppressed, 0);
    }
}
