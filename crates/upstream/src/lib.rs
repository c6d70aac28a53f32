//! Upstream MCP servers: where their definitions come from ([`discovery`]), the warm client pool
//! ([`pool`]; one server's connection in [`connection`], its secrets in [`secrets`]), and the
//! catalog of their tools with fuzzy search ([`catalog`]). What it reports to its callers (why
//! an exec could not be bound, what a search skipped, the `servers` view) is in [`report`].
//!
//! The sandbox side sees upstreams only through [`Upstreams::load_for`], which returns the
//! metadata to send with an exec and an `RpcHandler` that answers the sandbox's RPCs for that
//! exec alone: docs and search cover every discovered server (served from the persisted
//! catalog, [`store`], and started only for a server that has no entry there), tool calls only
//! the servers loaded for the exec. The handler keeps the pool slots of those servers, so a
//! proxied call goes straight to its server. Nothing of a server's `env` or `headers` is ever
//! part of what goes to the sandbox.
//!
//! The upstream side itself, [`Upstreams`], is in `upstreams.rs`; binding an exec in `bind.rs`.
//! This file defines nothing: it names the modules and re-exports what the crates above use.
//!
//! This side knows the wire types ([`bridge_core::protocol`]) and the configuration, and nothing
//! of the sandbox.

// The layers below are called by their own names (`bridge_core::config::…`); `crate::` is this crate.

mod bind;
pub mod catalog;
pub mod connection;
pub mod discovery;
mod flowgate;
mod info;
pub mod pool;
mod record;
mod relay;
pub mod report;
pub mod rpc;
pub mod schema;
pub mod secrets;
pub mod stdio;
pub mod store;
mod upstreams;

pub use discovery::{
    DiscoveredEntry, Discovery, DiscoveryContext, Origin, SOURCES, SearchedLocation, ServerEntry,
    SkippedEntry, SourceKind, SourceSpec, discover,
};
pub use pool::{CallError, CatalogMeta, Pool, SEARCH_WAIT, UpstreamSettings};
pub use relay::{CallRelay, ClientLink, NoAnswer, ProgressSink, UpstreamProgress};
pub use report::{BindError, Refreshed, ServerSource, SkippedServer, SourcesReport};
pub use rpc::RpcError;
pub use upstreams::{CallContext, Upstreams, hydrate_concurrency};
