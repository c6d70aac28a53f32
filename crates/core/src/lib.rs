//! The bottom layer of mcp-code-bridge: the configuration and the vocabulary every other crate
//! speaks (who is calling, the sandbox's wire protocol, errors with hints, the state directory's
//! files, the policy's decisions, the audit log). Nothing here starts a container, a server or
//! a connection. See ARCHITECTURE.md.

pub mod audit;
pub mod boxed;
pub mod clock;
pub mod config;
pub mod error;
pub mod flock;
pub mod flows;
pub mod identity;
pub mod logging;
pub mod policy;
pub mod procfs;
pub mod protocol;
pub mod statefile;
pub mod text;
pub mod trace;
