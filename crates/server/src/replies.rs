//! Error replies the MCP face gives to requests it does not serve: methods protocol revision
//! 2026-07-28 removed, and the one log line every refusal leaves. (Methods it does not implement
//! are answered by `handler`, which knows the ones it does.)

use rmcp::RoleServer;
use rmcp::model::ErrorData;
use rmcp::service::RequestContext;

/// The methods protocol revision 2026-07-28 removed (its lifecycle has no `initialize`, its
/// requests carry their log level, subscriptions are `subscriptions/listen`): a request of that
/// revision for one of them is "method not found" (`-32601`, which rmcp's HTTP transport
/// answers with `404`), as the revision says, however well or badly formed its params are.
pub(super) const REMOVED_IN_2026_07_28: [&str; 5] = [
    "initialize",
    "ping",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
];

/// Whether `context` is a request of protocol revision 2026-07-28 or newer: its own `_meta`
/// says so, or (rmcp reads it from the `MCP-Protocol-Version` header for requests without
/// a session) its peer's.
pub(super) fn is_2026_07_28(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= rmcp::model::ProtocolVersion::V_2026_07_28.as_str())
}

/// `-32601` for `method`, which revision 2026-07-28 does not have.
pub(super) fn removed_in_2026_07_28(method: &str) -> ErrorData {
    ErrorData::new(
        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
        format!(
            "{method:?} does not exist in protocol revision 2026-07-28; requests stand alone (server/discover describes this server) and carry their log level in _meta"
        ),
        None,
    )
}

/// An error reply, logged as one readable line first (rmcp's own log of it is the error's Debug
/// form, left out by `logging`). At INFO: it is the client's request that was wrong, not the
/// bridge.
pub(super) fn refused(method: &str, e: ErrorData) -> ErrorData {
    tracing::info!("{method}: answered with error {} ({})", e.code.0, e.message);
    e
}
