//! mcp-code-bridge: an MCP server with one tool, `run_python`, whose code runs in a hardened
//! container and reaches the user's MCP servers through the bridge. See ARCHITECTURE.md.
//!
//! This crate is the top of the workspace: the HTTP transport (`http`, `oauth`) and the command
//! line (`cli`). The layers below are crates of their own, called by their own names
//! (`bridge_core`, `bridge_sandbox`, …) here and in the tests; `crate::` is this crate.

pub mod cli;
pub mod http;
pub mod oauth;
pub mod otel;
