//! mcp-code-bridge: an MCP server with one tool, `run_python`, whose code runs in a hardened
//! container and reaches the user's MCP servers through the bridge. See ARCHITECTURE.md.

pub mod audit;
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod flock;
pub mod http;
pub mod identity;
pub mod logging;
pub mod oauth;
pub mod packages;
pub mod policy;
pub mod procfs;
pub mod protocol;
pub mod sandbox;
pub mod server;
pub mod skills;
pub mod statefile;
pub mod text;
pub mod upstream;
