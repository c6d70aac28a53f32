//! `serve`'s one shape of an error body, for every refusal made outside rmcp (not found,
//! Host or Origin refused, no or a bad token, a bound reached, a malformed 2025-11-25 task
//! request).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A JSON error body: what went wrong, for a person reading a client's log.
pub(super) fn problem(status: StatusCode, error: &str, description: String) -> Response {
    (
        status,
        axum::Json(json!({"error": error, "error_description": description})),
    )
        .into_response()
}
