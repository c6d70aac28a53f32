//! mcp-code-bridge: an MCP server with one tool, `run_python`, whose code runs in a hardened
//! container and reaches the user's MCP servers through the bridge. See ARCHITECTURE.md.
//!
//! This crate is the top of the workspace: the HTTP transport (`http`, `oauth`) and the command
//! line (`cli`). The layers below are crates of their own, re-exported here under the module
//! names the code and the tests use.

pub mod cli;
pub mod http;
pub mod oauth;
pub mod otel;

pub use mcp_code_bridge_core::{
    audit, clock, config, error, flock, identity, logging, policy, procfs, protocol, statefile,
    text, trace,
};
pub use mcp_code_bridge_packages as packages;
pub use mcp_code_bridge_sandbox as sandbox;
pub use mcp_code_bridge_server as server;
pub use mcp_code_bridge_skills as skills;
pub use mcp_code_bridge_upstream as upstream;
