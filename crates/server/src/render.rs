//! An exec outcome -> the MCP result the model sees.
//!
//! Each byte of output travels once, in `content`: hosts differ in what they pass to the
//! model (most take the text content; Claude Code takes `structuredContent` alone when there
//! is one), so a result with both would carry its output twice and a host would see it once
//! at best. In compact mode each part is its own text block (stdout, `[stderr]`, the value, the
//! error, the bridge's notices, the files), named in the block's `_meta` (`PART_META`) so that
//! a program can take one part exactly; in TOON mode one block carries them all. What a program
//! wants besides (status, session, error type, counts, the parts kept as files) is in the
//! result's `_meta` (`RESULT_META`), which no host shows the model. Displayed figures are image
//! content; files of `/workspace/out` and parts kept whole are resource links.

use rmcp::model::{CallToolResult, ContentBlock as Content, MetaObject, TextContent};
use serde::Serialize;
use serde_json::Value;

use super::budget::{self, Budget};
use bridge_core::config::OutputMode;
use bridge_core::protocol::ExecError;
use bridge_sandbox::{ExecOutcome, Outcome};

/// The `_meta` key of a result's metadata ([`Meta`]).
pub const RESULT_META: &str = "mcp-code-bridge/result";
/// The `_meta` key naming the part a text block carries (`stdout`, `stderr`, `value`,
/// `error`, `notices`, `files`; `toon` for the one block of TOON mode).
pub const PART_META: &str = "mcp-code-bridge/part";

/// What a result says besides its output, in its `_meta`; empty fields are left out.
#[derive(Debug, Serialize)]
pub struct Meta<'a> {
    /// How the call ended.
    pub status: Outcome,
    /// The interpreter the call ran in, named in every result: the one the call named, else
    /// the default (`call_args` in `tool.rs` says which), so a client that named none learns
    /// the name that reaches the same state from elsewhere.
    pub session: &'a str,
    /// The code's error: its type and message (the traceback is in the `error` part).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorMeta<'a>>,
    /// Images the code displayed.
    #[serde(skip_serializing_if = "is_zero")]
    pub images: usize,
    /// Bytes of output the output cap dropped.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub truncated_bytes: u64,
    /// The interpreter's state is gone: the next call of the session starts fresh.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub session_reset: bool,
    /// `"live"`: the session was taken, running, from the bridge before this one;
    /// `"snapshot"`: it was restored from its snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<&'static str>,
    /// With `"snapshot"`: the names that could not be kept, as `name (type)`.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub lost: &'a [String],
    /// How long the call took, in milliseconds.
    pub duration_ms: u64,
    /// The parts over `output_budget`, kept whole: `{part, uri, path, size}`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<KeptMeta<'a>>,
}

/// The code's error in [`Meta`]: `{type, message}`.
#[derive(Debug, Serialize)]
pub struct ErrorMeta<'a> {
    /// The exception's type (`ValueError`), or the bridge's name for what ended the code
    /// (`MemoryLimitExceeded`).
    #[serde(rename = "type")]
    pub kind: &'a str,
    /// The exception's message, or what the bridge saw; left out when empty.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub message: &'a str,
}

/// One part kept whole as a file, in [`Meta`]: `{part, uri, path, size}`.
#[derive(Debug, Serialize)]
pub struct KeptMeta<'a> {
    /// Which part: `stdout`, `stderr`, `value` or `error`.
    pub part: &'static str,
    /// Its resource URI, which `resources/read` reads.
    pub uri: &'a str,
    /// Where the next call's code reads it; absent when it could not be written there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Its size in bytes.
    pub size: u64,
}

/// The whole payload of TOON mode's one block: the metadata and every part.
#[derive(Debug, Serialize)]
pub struct Payload<'a> {
    /// How the call ended.
    pub status: Outcome,
    /// The interpreter the call ran in ([`Meta::session`]).
    pub session: &'a str,
    /// What the code printed to stdout; left out when empty.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub stdout: &'a str,
    /// What the code printed to stderr; left out when empty.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub stderr: &'a str,
    /// The last expression's value, as the notebook would show it, if it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<&'a str>,
    /// The code's error, with its traceback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorPayload<'a>>,
    /// Sentences for the model about what the bridge did (interrupts, resets, limits).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notices: &'a Vec<String>,
    /// Images the code displayed (each is image content beside this block).
    #[serde(skip_serializing_if = "is_zero")]
    pub images: usize,
    /// Bytes of output the output cap dropped.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub truncated_bytes: u64,
    /// The interpreter's state is gone: the next call of the session starts fresh.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub session_reset: bool,
    /// How long the call took, in milliseconds.
    pub duration_ms: u64,
}

/// The code's error in a [`Payload`]: `{type, message, traceback}`.
#[derive(Debug, Serialize)]
pub struct ErrorPayload<'a> {
    /// The exception's type (`ValueError`), or the bridge's name for what ended the code
    /// (`MemoryLimitExceeded`).
    #[serde(rename = "type")]
    pub kind: &'a str,
    /// The exception's message, or what the bridge saw; left out when empty.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub message: &'a str,
    /// The Python traceback; left out when empty.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub traceback: &'a str,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// The result's `_meta` ([`RESULT_META`]) of outcome `o` of a call in `session`.
pub fn meta<'a>(o: &'a ExecOutcome, session: &'a str) -> Meta<'a> {
    Meta {
        status: o.outcome,
        session,
        error: o.error.as_ref().map(|e: &ExecError| ErrorMeta {
            kind: &e.kind,
            message: &e.message,
        }),
        images: o.images.len(),
        truncated_bytes: o.truncated,
        session_reset: o.session_reset,
        resumed: o.resumed,
        lost: &o.lost,
        duration_ms: o.duration.as_millis() as u64,
        kept: o
            .kept
            .iter()
            .map(|k| KeptMeta {
                part: k.part.name(),
                uri: &k.file.uri,
                path: k
                    .in_sandbox
                    .is_ok()
                    .then(|| format!("{}/{}", bridge_sandbox::files::OUT_DIR, k.file.name)),
                size: k.file.size,
            })
            .collect(),
    }
}

/// TOON mode's one block of outcome `o` of a call in `session`, before it is encoded.
pub fn payload<'a>(o: &'a ExecOutcome, session: &'a str) -> Payload<'a> {
    Payload {
        status: o.outcome,
        session,
        stdout: &o.stdout,
        stderr: &o.stderr,
        value: o.value.as_deref(),
        error: o.error.as_ref().map(|e: &ExecError| ErrorPayload {
            kind: &e.kind,
            message: &e.message,
            traceback: &e.traceback,
        }),
        notices: &o.notices,
        images: o.images.len(),
        truncated_bytes: o.truncated,
        session_reset: o.session_reset,
        duration_ms: o.duration.as_millis() as u64,
    }
}

/// The parts of `o` as a terminal would show them, each named: stdout, stderr, the value, the
/// error, then the bridge's notices and the files of `/workspace/out` (a line for each of the
/// first `listed`, one for the rest).
pub fn parts(o: &ExecOutcome, listed: usize) -> Vec<(&'static str, String)> {
    let mut parts = Vec::new();
    if !o.stdout.is_empty() {
        parts.push(("stdout", o.stdout.clone()));
    }
    if !o.stderr.is_empty() {
        parts.push(("stderr", format!("[stderr]\n{}", o.stderr)));
    }
    if let Some(v) = &o.value {
        parts.push(("value", v.clone()));
    }
    if let Some(e) = &o.error {
        let text = if !e.traceback.is_empty() {
            e.traceback.trim_end_matches('\n').to_string()
        } else if e.message.is_empty() {
            e.kind.clone()
        } else {
            format!("{}: {}", e.kind, e.message)
        };
        parts.push(("error", text));
    }
    if !o.notices.is_empty() {
        let lines: Vec<String> = o.notices.iter().map(|n| format!("[bridge] {n}")).collect();
        parts.push(("notices", lines.join("\n")));
    }
    if !o.files.is_empty() {
        let mut lines: Vec<String> = o
            .files
            .iter()
            .take(listed)
            .map(|f| {
                format!(
                    "[file] {}/{} ({}, {} bytes): {}",
                    bridge_sandbox::files::OUT_DIR,
                    budget::shown_file_name(&f.name),
                    f.mime,
                    f.size,
                    f.uri
                )
            })
            .collect();
        if o.files.len() > listed {
            lines.push(format!(
                "[file] and {} more in {}, past the output budget: resources/list lists them all",
                o.files.len() - listed,
                bridge_sandbox::files::OUT_DIR
            ));
        }
        parts.push(("files", lines.join("\n")));
    }
    parts
}

/// Plain text as a terminal would show it: the parts, a line apart.
pub fn compact_text(o: &ExecOutcome) -> String {
    let parts = parts(o, usize::MAX);
    if parts.is_empty() {
        return empty_text(o);
    }
    parts
        .into_iter()
        .map(|(_, t)| t.trim_end_matches('\n').to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// What a result with no text part says.
fn empty_text(o: &ExecOutcome) -> String {
    match o.images.len() {
        0 => "(no output)".into(),
        1 => "(1 image)".into(),
        n => format!("({n} images)"),
    }
}

/// The TOON block of the payload; JSON when the encoder fails.
pub fn toon_text(p: &Payload<'_>) -> String {
    let v = serde_json::to_value(p).unwrap_or(Value::Null);
    match toon_format::encode_default(&v) {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!("TOON encoding failed ({e}); falling back to JSON");
            serde_json::to_string_pretty(&v).unwrap_or_default()
        }
    }
}

fn block(text: String, part: &str) -> Content {
    let mut m = serde_json::Map::new();
    m.insert(PART_META.into(), Value::from(part));
    Content::Text(TextContent::new(text).with_meta(MetaObject(m)))
}

fn result_meta(v: Value) -> MetaObject {
    let mut m = serde_json::Map::new();
    m.insert(RESULT_META.into(), v);
    MetaObject(m)
}

/// The whole tool result, its output within `budget` (see `server::budget`). Takes the outcome
/// by value: its images (up to 12 MiB of base64) move into the content instead of being
/// copied, which the bridge's memory bound counts on.
pub fn tool_result(
    mut o: ExecOutcome,
    mode: OutputMode,
    session: &str,
    budget: &Budget,
) -> CallToolResult {
    budget::fit(&mut o, budget);
    let listed = budget::files_listed(&o, budget);
    let mut content = match mode {
        OutputMode::Compact => {
            let parts = parts(&o, listed);
            if parts.is_empty() {
                vec![Content::text(empty_text(&o))]
            } else {
                parts.into_iter().map(|(p, t)| block(t, p)).collect()
            }
        }
        OutputMode::Toon => vec![block(toon_text(&payload(&o, session)), "toon")],
    };
    let meta = serde_json::to_value(meta(&o, session)).unwrap_or(Value::Null);
    for (mime, data) in std::mem::take(&mut o.images) {
        content.push(Content::image(data, mime));
    }
    // Files of /workspace/out, and the parts kept whole, as links the client reads with
    // resources/read: the files within the budget (their names, titles and URIs are the
    // code's words, counted as the text's lines are), the kept parts always (named by the
    // bridge).
    let kept = std::mem::take(&mut o.kept).into_iter().map(|k| k.file);
    let files = std::mem::take(&mut o.files).into_iter().take(listed);
    for f in files.chain(kept) {
        let name = budget::shown_file_name(&f.name);
        let title = format!("{}/{name}", bridge_sandbox::files::OUT_DIR);
        let r = rmcp::model::Resource::new(f.uri, name)
            .with_title(title)
            .with_mime_type(f.mime)
            .with_size(f.size);
        content.push(Content::resource_link(r));
    }
    let mut r = if matches!(o.outcome, Outcome::Ok) {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    };
    r.meta = Some(result_meta(meta));
    r
}

/// Name the trace of the call in its result's `_meta` (`trace_id`, 32 hex digits), so a log
/// line, an audit record and a trace find each other.
pub fn add_trace_id(r: &mut CallToolResult, id: &str) {
    if let Some(Value::Object(m)) = r.meta.as_mut().and_then(|m| m.0.get_mut(RESULT_META)) {
        m.insert("trace_id".into(), Value::from(id));
    }
}

/// A call that could not start: no sandbox (`SandboxUnavailable`: no engine, no image), a server
/// name not configured (`UnknownServer`), or a loaded server that could not be started
/// (`ServerUnavailable`). An error result the model can read; `kind` is its `error.type`, and
/// `session` the interpreter it was for.
pub fn setup_error(kind: &str, message: &str, session: &str) -> CallToolResult {
    let mut r = CallToolResult::error(vec![block(format!("[bridge] {message}"), "error")]);
    r.meta = Some(result_meta(
        serde_json::json!({"status": "unavailable", "session": session,
        "error": {"type": kind, "message": message}}),
    ));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome() -> ExecOutcome {
        ExecOutcome::printed("2\n")
    }

    fn budget() -> Budget {
        Budget::new(8000)
    }

    fn meta_of(r: &CallToolResult) -> Value {
        r.meta.as_ref().unwrap().0[RESULT_META].clone()
    }

    /// The output is in the content once, each part a block named in its `_meta`; the
    /// result's `_meta` has the rest, empty fields left out; there is no `structuredContent`.
    #[test]
    fn output_travels_once_in_named_blocks() {
        let o = outcome();
        assert_eq!(compact_text(&o), "2");
        let r = tool_result(o, OutputMode::Compact, "default", &budget());
        assert_eq!(r.structured_content, None);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v["content"],
            serde_json::json!([{"type": "text", "text": "2\n", "_meta": {PART_META: "stdout"}}])
        );
        assert_eq!(
            meta_of(&r),
            serde_json::json!({"status": "ok", "session": "default", "duration_ms": 3})
        );
    }

    /// Files of /workspace/out become resource_link items (uri, name, MIME type, size) after the
    /// text and images, and a line of the compact text each.
    #[test]
    fn files_become_resource_links() {
        let mut o = outcome();
        o.files = vec![bridge_sandbox::files::OutFile {
            name: "sales.csv".into(),
            mime: "text/csv".into(),
            size: 12,
            uri: "resource://mcp-code-bridge/files/default/sales.csv".into(),
        }];
        assert!(compact_text(&o).ends_with(
            "[file] /workspace/out/sales.csv (text/csv, 12 bytes): resource://mcp-code-bridge/files/default/sales.csv"
        ));
        let r = tool_result(o, OutputMode::Compact, "default", &budget());
        let v = serde_json::to_value(&r.content[2]).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "resource_link", "uri": "resource://mcp-code-bridge/files/default/sales.csv",
                "name": "sales.csv", "title": "/workspace/out/sales.csv", "mimeType": "text/csv", "size": 12})
        );
    }

    fn rich() -> ExecOutcome {
        let mut o = outcome();
        o.outcome = Outcome::Timeout;
        o.stdout = "step 1\nstep 2\n".into();
        o.stderr = "warning: slow\n".into();
        o.value = Some("   a  b\n0  1  2".into());
        o.images = vec![("image/png".into(), "iVBORw0KGgo=".into())];
        o.truncated = 12;
        o.notices = vec!["the time limit of 5s expired and the code was interrupted (KeyboardInterrupt); the session and its variables are kept.".into()];
        o
    }

    #[test]
    fn snapshots_of_rendered_text() {
        let mut err = outcome();
        err.outcome = Outcome::Error;
        err.stdout = "partial\n".into();
        err.error = Some(ExecError {
            kind: "KeyError".into(),
            message: "'x'".into(),
            traceback: "Traceback (most recent call last):\n  File \"<cell-3>\", line 1, in <module>\nKeyError: 'x'\n".into(),
        });
        insta::assert_snapshot!("compact_ok", compact_text(&outcome()));
        insta::assert_snapshot!("compact_error", compact_text(&err));
        insta::assert_snapshot!("compact_timeout_rich", compact_text(&rich()));
        insta::assert_snapshot!("toon_error", toon_text(&payload(&err, "default")));
        insta::assert_snapshot!("toon_timeout_rich", toon_text(&payload(&rich(), "default")));
    }

    #[test]
    fn toon_decodes_back_to_the_structured_payload() {
        for o in [outcome(), rich()] {
            let p = payload(&o, "default");
            let decoded: Value = toon_format::decode_default(&toon_text(&p)).unwrap();
            assert_eq!(decoded, serde_json::to_value(&p).unwrap());
        }
    }

    #[test]
    fn images_become_image_content() {
        let r = tool_result(rich(), OutputMode::Compact, "default", &budget());
        assert_eq!(r.content.len(), 5);
        let v = serde_json::to_value(&r.content[4]).unwrap();
        assert_eq!(v["type"], "image");
        assert_eq!(v["mimeType"], "image/png");
        assert_eq!(meta_of(&r)["images"], 1);
    }

    #[test]
    fn errors_show_traceback_and_mark_result() {
        let mut o = outcome();
        o.outcome = Outcome::Error;
        o.error = Some(ExecError {
            kind: "ZeroDivisionError".into(),
            message: "division by zero".into(),
            traceback: "Traceback ...\nZeroDivisionError: division by zero\n".into(),
        });
        let r = tool_result(o, OutputMode::Compact, "default", &budget());
        assert_eq!(r.is_error, Some(true));
        assert_eq!(meta_of(&r)["error"]["type"], "ZeroDivisionError");
        let s = serde_json::to_value(&r).unwrap();
        assert!(
            s["content"][1]["text"]
                .as_str()
                .unwrap()
                .ends_with("ZeroDivisionError: division by zero")
        );
    }
}
