//! An exec outcome -> MCP content: plain text (compact) or a TOON block, plus `structuredContent`
//! carrying only the non-empty fields, and image content for displayed figures.

use rmcp::model::{CallToolResult, ContentBlock as Content};
use serde::Serialize;
use serde_json::Value;

use crate::config::OutputMode;
use crate::protocol::ExecError;
use crate::sandbox::{ExecOutcome, Outcome};

/// The payload mirrored in `structuredContent`; empty fields are left out.
#[derive(Debug, Serialize)]
pub struct Payload<'a> {
    pub status: Outcome,
    /// The interpreter the call ran in, named in every result: the one the call named, else
    /// the default (`server::Bridge::run_for` says which), so a client that named none learns
    /// the name that reaches the same state from elsewhere.
    pub session: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub stdout: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub stderr: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorPayload<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notices: &'a Vec<String>,
    #[serde(skip_serializing_if = "is_zero")]
    pub images: usize,
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub truncated_bytes: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub session_reset: bool,
    pub duration_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct ErrorPayload<'a> {
    #[serde(rename = "type")]
    pub kind: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub traceback: &'a str,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

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

/// Plain text as a terminal would show it: stdout, stderr, the value, the error, then the
/// bridge's notices.
pub fn compact_text(o: &ExecOutcome) -> String {
    let mut parts: Vec<String> = Vec::new();
    if !o.stdout.is_empty() {
        parts.push(o.stdout.trim_end_matches('\n').to_string());
    }
    if !o.stderr.is_empty() {
        parts.push(format!("[stderr]\n{}", o.stderr.trim_end_matches('\n')));
    }
    if let Some(v) = &o.value {
        parts.push(v.clone());
    }
    if let Some(e) = &o.error {
        if !e.traceback.is_empty() {
            parts.push(e.traceback.trim_end_matches('\n').to_string());
        } else if e.message.is_empty() {
            parts.push(e.kind.clone());
        } else {
            parts.push(format!("{}: {}", e.kind, e.message));
        }
    }
    for n in &o.notices {
        parts.push(format!("[bridge] {n}"));
    }
    for f in &o.files {
        parts.push(format!(
            "[file] {}/{} ({}, {} bytes): {}",
            crate::sandbox::files::OUT_DIR,
            f.name,
            f.mime,
            f.size,
            f.uri
        ));
    }
    if parts.is_empty() {
        if o.images.is_empty() {
            return "(no output)".into();
        }
        return format!(
            "({} image{})",
            o.images.len(),
            if o.images.len() == 1 { "" } else { "s" }
        );
    }
    parts.join("\n")
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

/// The whole tool result. Takes the outcome by value: its images (up to 12 MiB of base64) move
/// into the content instead of being copied, which the bridge's memory bound counts on.
pub fn tool_result(mut o: ExecOutcome, mode: OutputMode, session: &str) -> CallToolResult {
    let (text, structured) = {
        let p = payload(&o, session);
        let text = match mode {
            OutputMode::Compact => compact_text(&o),
            OutputMode::Toon => toon_text(&p),
        };
        (text, serde_json::to_value(&p).unwrap_or(Value::Null))
    };
    let mut content = vec![Content::text(text)];
    for (mime, data) in std::mem::take(&mut o.images) {
        content.push(Content::image(data, mime));
    }
    // Files of /workspace/out as links the client reads with resources/read.
    for f in std::mem::take(&mut o.files) {
        let title = format!("{}/{}", crate::sandbox::files::OUT_DIR, f.name);
        let r = rmcp::model::Resource::new(f.uri, f.name)
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
    r.structured_content = Some(structured);
    r
}

/// A call that could not start: no sandbox (`SandboxUnavailable`: no engine, no image), a server
/// name not configured (`UnknownServer`), or a loaded server that could not be started
/// (`ServerUnavailable`). An error result the model can read; `kind` is its `error.type`, and
/// `session` the interpreter it was for.
pub fn setup_error(kind: &str, message: &str, session: &str) -> CallToolResult {
    let mut r = CallToolResult::error(vec![Content::text(format!("[bridge] {message}"))]);
    r.structured_content = Some(
        serde_json::json!({"status": "unavailable", "session": session,
        "error": {"type": kind, "message": message}}),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn outcome() -> ExecOutcome {
        ExecOutcome {
            outcome: Outcome::Ok,
            stdout: "2\n".into(),
            stderr: String::new(),
            value: None,
            error: None,
            images: vec![],
            files: vec![],
            duration: Duration::from_millis(3),
            truncated: 0,
            notices: vec![],
            session_reset: false,
        }
    }

    #[test]
    fn compact_drops_empty_fields() {
        let o = outcome();
        assert_eq!(compact_text(&o), "2");
        let v = serde_json::to_value(payload(&o, "default")).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"status": "ok", "session": "default", "stdout": "2\n", "duration_ms": 3})
        );
    }

    /// Files of /workspace/out become resource_link items (uri, name, MIME type, size) after the
    /// text and images, and a line of the compact text each.
    #[test]
    fn files_become_resource_links() {
        let mut o = outcome();
        o.files = vec![crate::sandbox::files::OutFile {
            name: "sales.csv".into(),
            mime: "text/csv".into(),
            size: 12,
            uri: "resource://mcp-code-bridge/files/default/sales.csv".into(),
        }];
        assert!(compact_text(&o).ends_with(
            "[file] /workspace/out/sales.csv (text/csv, 12 bytes): resource://mcp-code-bridge/files/default/sales.csv"
        ));
        let r = tool_result(o, OutputMode::Compact, "default");
        let v = serde_json::to_value(&r.content[1]).unwrap();
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
        let r = tool_result(rich(), OutputMode::Compact, "default");
        assert_eq!(r.content.len(), 2);
        let v = serde_json::to_value(&r.content[1]).unwrap();
        assert_eq!(v["type"], "image");
        assert_eq!(v["mimeType"], "image/png");
        assert_eq!(r.structured_content.as_ref().unwrap()["images"], 1);
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
        let r = tool_result(o, OutputMode::Compact, "default");
        assert_eq!(r.is_error, Some(true));
        let s = serde_json::to_value(&r).unwrap();
        assert!(
            s["content"][0]["text"]
                .as_str()
                .unwrap()
                .ends_with("ZeroDivisionError: division by zero")
        );
    }
}
