//! Traces: the spans every layer makes of its part of a call, on OpenTelemetry's API. Whether
//! they go anywhere is the top crate's business (`otel`, which installs the exporter and the
//! W3C propagator): until it does, every span here is a no-op, and one whose parent came from a
//! client's `traceparent` still carries that trace's id, so the audit log names it either way.
//!
//! A span's parent is the current context: the call's span is made current for the call's
//! future ([`Within::within`]); tasks a call spawns carry it over ([`Within::in_current`]).
//! Attribute values are the bridge's own words and figures, never a call's arguments, code or
//! output, except where `otel_content` puts the code and output on the call's span.

use std::borrow::Cow;

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{KeyValue, global};

pub use opentelemetry::Context;
pub use opentelemetry::KeyValue as Attr;
pub use opentelemetry::trace::SpanKind;

/// The instrumentation scope of every span.
pub const SCOPE: &str = "mcp-code-bridge";

/// The most of a call's code or output a span carries with `otel_content`: the rest is cut,
/// and the attribute says how much there was.
pub const MAX_CONTENT: usize = 64 << 10;

/// The request `_meta` keys of W3C Trace Context (SEP-414).
pub const META_KEYS: [&str; 2] = ["traceparent", "tracestate"];

/// Futures run with a trace context current.
pub trait Within: Sized {
    /// Run with `cx` as the current context (its span the parent of the spans made inside).
    fn within(self, cx: Context) -> opentelemetry::context::WithContext<Self>;
    /// Run with the context current here: for a task spawned by a call, so its spans stay the
    /// call's.
    fn in_current(self) -> opentelemetry::context::WithContext<Self>;
}

impl<F: std::future::Future> Within for F {
    fn within(self, cx: Context) -> opentelemetry::context::WithContext<Self> {
        opentelemetry::context::FutureExt::with_context(self, cx)
    }
    fn in_current(self) -> opentelemetry::context::WithContext<Self> {
        opentelemetry::context::FutureExt::with_current_context(self)
    }
}

/// The context a request's `_meta` names as its parent (its `traceparent` and `tracestate`),
/// or the empty context: a value that is missing, not a string or not W3C's format is
/// ignored, never an error.
pub fn parent_of(meta: &serde_json::Map<String, serde_json::Value>) -> Context {
    struct Meta<'a>(&'a serde_json::Map<String, serde_json::Value>);
    impl Extractor for Meta<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            // Bounded: W3C's own limits are 55 and 512 characters.
            self.0
                .get(key)
                .and_then(serde_json::Value::as_str)
                .filter(|v| v.len() <= 1024)
        }
        fn keys(&self) -> Vec<&str> {
            META_KEYS
                .into_iter()
                .filter(|k| self.0.contains_key(*k))
                .collect()
        }
    }
    if !META_KEYS.iter().any(|k| meta.contains_key(*k)) {
        return Context::new();
    }
    global::get_text_map_propagator(|p| p.extract(&Meta(meta)))
}

/// The `_meta` entries that make `cx` the parent of a request the bridge sends (an upstream
/// server's `tools/call`): empty when `cx` has no valid span.
pub fn meta_of(cx: &Context) -> serde_json::Map<String, serde_json::Value> {
    struct Meta(serde_json::Map<String, serde_json::Value>);
    impl Injector for Meta {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key.to_string(), value.into());
        }
    }
    let mut meta = Meta(serde_json::Map::new());
    if cx.span().span_context().is_valid() {
        global::get_text_map_propagator(|p| p.inject_context(cx, &mut meta));
    }
    meta.0
}

/// The trace id of `cx`'s span (32 hex digits), if it has a valid one: for the audit log and
/// the reply's `_meta`, so a log line and a trace find each other.
pub fn trace_id(cx: &Context) -> Option<String> {
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// The trace id of the current context ([`trace_id`]).
pub fn current_trace_id() -> Option<String> {
    trace_id(&Context::current())
}

/// A new span, child of `parent`, and the context that has it current. Its name is
/// OpenTelemetry's MCP convention where one applies (`tools/call run_python`).
pub fn start(
    parent: &Context,
    name: impl Into<Cow<'static, str>>,
    kind: SpanKind,
    attrs: Vec<KeyValue>,
) -> Context {
    let tracer = global::tracer(SCOPE);
    let span = tracer
        .span_builder(name)
        .with_kind(kind)
        .with_attributes(attrs)
        .start_with_context(&tracer, parent);
    parent.with_span(span)
}

/// A span for a piece of work inside the current call (its sandbox, an install, a question
/// to the user): [`start`] under the current context.
pub fn internal(name: impl Into<Cow<'static, str>>, attrs: Vec<KeyValue>) -> Context {
    start(&Context::current(), name, SpanKind::Internal, attrs)
}

/// A proxied call to another server: [`start`] under the current context, kind client.
pub fn client(name: impl Into<Cow<'static, str>>, attrs: Vec<KeyValue>) -> Context {
    start(&Context::current(), name, SpanKind::Client, attrs)
}

/// Whether `cx`'s span is sent anywhere: work done only for a span's attributes is skipped
/// when it is not.
pub fn recording(cx: &Context) -> bool {
    cx.span().is_recording()
}

/// Add attributes to `cx`'s span.
pub fn set(cx: &Context, attrs: Vec<KeyValue>) {
    cx.span().set_attributes(attrs);
}

/// End `cx`'s span, failed with `error` (its type, as `error.type`) when there is one.
pub fn end(cx: &Context, error: Option<&str>) {
    let span = cx.span();
    if let Some(kind) = error {
        let kind = error_type(kind);
        span.set_attribute(KeyValue::new("error.type", kind.clone()));
        span.set_status(Status::error(kind));
    }
    span.end();
}

/// The longest error type a span carries.
pub const MAX_ERROR_TYPE: usize = 128;

/// An error's type as a span carries it: a dotted name of ASCII identifiers (a Python
/// exception's `__qualname__`, the bridge's own kinds) of at most [`MAX_ERROR_TYPE`] bytes, as
/// it is; anything else, which the code may have chosen to carry text out (an exception class
/// whose `__qualname__` was set to 20,000 characters of a customer's data), is `_OTHER`, as
/// OpenTelemetry's conventions name an error type of no known form.
pub fn error_type(kind: &str) -> String {
    let word = |w: &str| {
        w.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if !kind.is_empty() && kind.len() <= MAX_ERROR_TYPE && kind.split('.').all(word) {
        kind.to_string()
    } else {
        "_OTHER".to_string()
    }
}

/// A span that ends when dropped unless ended first: for work whose future may be dropped (a
/// cancelled call's proxied call, an install cut off by the call's timeout), recorded then as
/// `cancelled`.
pub struct Guard {
    cx: Option<Context>,
}

impl Guard {
    /// Guard `cx`'s span, started by the caller ([`internal`] and the like).
    pub fn new(cx: Context) -> Self {
        Self { cx: Some(cx) }
    }

    /// The span's context: to set attributes on it, or to run work within it.
    pub fn context(&self) -> &Context {
        self.cx.as_ref().expect("set until ended")
    }

    /// End the span now, failed with `error` (its type) when there is one, as [`end`] does.
    pub fn end(mut self, error: Option<&str>) {
        if let Some(cx) = self.cx.take() {
            end(&cx, error);
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(cx) = self.cx.take() {
            end(&cx, Some("cancelled"));
        }
    }
}

/// `text` as a span carries it: at most [`MAX_CONTENT`] bytes, cut on a character boundary
/// with a line saying so.
pub fn content(text: &str) -> String {
    if text.len() <= MAX_CONTENT {
        return text.to_string();
    }
    let cut = crate::text::floor_char_boundary(text, MAX_CONTENT);
    format!(
        "{}\n[... {} bytes in all; the rest is not kept on the span]",
        &text[..cut],
        text.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    #[test]
    fn no_traceparent_is_no_parent_and_a_malformed_one_is_ignored() {
        let meta = serde_json::Map::new();
        assert!(trace_id(&parent_of(&meta)).is_none());
        let mut meta = serde_json::Map::new();
        meta.insert("traceparent".into(), serde_json::json!(17));
        assert!(trace_id(&parent_of(&meta)).is_none());
    }

    #[test]
    fn a_span_of_a_remote_parent_keeps_its_trace_id_without_an_exporter() {
        let sc = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let parent = Context::new().with_remote_span_context(sc);
        let cx = start(&parent, "tools/call run_python", SpanKind::Server, vec![]);
        assert_eq!(
            trace_id(&cx).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        end(&cx, None);
    }

    #[test]
    fn content_is_cut_on_a_character_boundary_and_says_so() {
        let text = "é".repeat(MAX_CONTENT);
        let kept = content(&text);
        assert!(kept.len() < MAX_CONTENT + 100);
        assert!(kept.ends_with("the rest is not kept on the span]"));
        assert_eq!(content("short"), "short");
    }

    #[test]
    fn an_error_type_is_a_bounded_dotted_name_or_other() {
        assert_eq!(error_type("ZeroDivisionError"), "ZeroDivisionError");
        assert_eq!(error_type("pkg.Outer.Inner_2"), "pkg.Outer.Inner_2");
        assert_eq!(error_type("_private"), "_private");
        for bad in [
            "",
            "LEAK: customer 4111-1111-1111-1111",
            "a..b",
            "1abc",
            "caf\u{e9}",
            "a\u{202e}b",
            &"Q".repeat(MAX_ERROR_TYPE + 1),
        ] {
            assert_eq!(error_type(bad), "_OTHER", "{bad:?}");
        }
        assert_eq!(
            error_type(&"Q".repeat(MAX_ERROR_TYPE)).len(),
            MAX_ERROR_TYPE
        );
    }
}
