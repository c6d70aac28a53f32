//! The 2025-11-25 form of tasks over HTTP: [`bridge_server::legacy_tasks`] applied to a POST's JSON body
//! before rmcp reads it, and to the answer of an `initialize` or `tools/list` (a JSON body, or
//! the events of an SSE stream) on its way out.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use serde_json::Value;

use super::problem::problem;
use bridge_server::legacy_tasks::Wire;

/// The largest answer translated; an `initialize` or `tools/list` answer is a few KiB.
const MAX_ANSWER: usize = 4 << 20;
/// How long such an answer may take to arrive whole.
const ANSWER_WAIT: Duration = Duration::from_secs(30);

/// Translate a POST's body; the [`Wire`] is returned when the answer must be translated too,
/// and the message as translated when the body is JSON (the one parse of it the bridge makes).
/// The body is read within `max_body` (as rmcp would read it).
pub(super) async fn inbound(
    request: Request,
    max_body: usize,
) -> Result<(Request, Option<Wire>, Option<Value>), Response> {
    if request.method() != axum::http::Method::POST {
        return Ok((request, None, None));
    }
    let headers = request.headers();
    let in_session = headers.contains_key("mcp-session-id");
    let version = headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (mut parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, max_body)
        .await
        .map_err(|_| too_large(max_body))?;
    let mut wire = Wire::for_http(in_session, version.as_deref());
    // rmcp answers what is not JSON.
    let mut message = serde_json::from_slice::<Value>(&bytes).ok();
    let bytes = match message.take() {
        Some(mut v) => {
            let before = v.get("method").cloned();
            wire.inbound(&mut v);
            let bytes = if v.get("method") != before.as_ref() {
                parts.headers.remove(header::CONTENT_LENGTH);
                serde_json::to_vec(&v).map(Into::into).unwrap_or(bytes)
            } else {
                bytes
            };
            message = Some(v);
            bytes
        }
        None => bytes,
    };
    let wire = wire.awaits_answers().then_some(wire);
    Ok((Request::from_parts(parts, Body::from(bytes)), wire, message))
}

/// Translate the answer `response` carries, as JSON or as SSE `data:` lines.
pub(super) async fn outbound(response: Response, mut wire: Wire) -> Response {
    let (mut parts, body) = response.into_parts();
    let sse = is_event_stream(&parts.headers);
    let bytes =
        match tokio::time::timeout(ANSWER_WAIT, axum::body::to_bytes(body, MAX_ANSWER)).await {
            Ok(Ok(b)) => b,
            _ => {
                return problem(
                    StatusCode::BAD_GATEWAY,
                    "answer_unreadable",
                    format!(
                        "the answer to this request was over {} MiB or took over {}s; retry",
                        MAX_ANSWER >> 20,
                        ANSWER_WAIT.as_secs()
                    ),
                );
            }
        };
    let out = if sse {
        let text = String::from_utf8_lossy(&bytes);
        let mut out = String::with_capacity(text.len() + 128);
        for line in text.split_inclusive('\n') {
            match line.strip_prefix("data:").map(str::trim) {
                Some(data) if data.starts_with('{') => match serde_json::from_str::<Value>(data) {
                    Ok(mut v) => {
                        wire.outbound(&mut v);
                        out.push_str("data: ");
                        out.push_str(&v.to_string());
                        out.push('\n');
                    }
                    Err(_) => out.push_str(line),
                },
                _ => out.push_str(line),
            }
        }
        out.into_bytes()
    } else {
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(mut v) => {
                wire.outbound(&mut v);
                serde_json::to_vec(&v).unwrap_or_else(|_| bytes.to_vec())
            }
            Err(_) => bytes.to_vec(),
        }
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

fn too_large(max_body: usize) -> Response {
    problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("the request body is over http.max_request_size ({max_body} bytes) or was cut off"),
    )
}
