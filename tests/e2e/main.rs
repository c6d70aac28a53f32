//! The end-to-end tests: the real `mcp-code-bridge` binary against real podman, real MCP servers
//! and real MCP clients. One test binary, one module per subject, so that the harness
//! (`common`) is compiled once and one binary is linked rather than one per file, which on a
//! small machine was most of the test command's time. Run one subject with a filter:
//! `cargo test --release --test e2e -- http::` (several filters may be given).

// A test harness has no API (its `pub` items are for its own modules), prints what a failure
// needs, and calls libc directly on test processes; the product's lints (Cargo.toml) are for
// the crates.
#![allow(
    unreachable_pub,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::undocumented_unsafe_blocks
)]

mod common;

mod approvals;
mod audit;
mod budget;
mod catalog;
mod cli;
mod conformance;
mod data_image;
mod discovery_cli;
mod docs;
mod faults;
mod faults_lifecycle;
mod files;
mod flows;
mod flows_adaptive;
mod hostile;
mod http;
mod inputs;
mod isolation;
mod notebook;
mod oauth;
mod packages;
mod policy;
mod pool;
mod proxy;
mod relay;
mod results;
mod resume;
mod sandbox;
mod schemas;
mod security;
mod security_rootless;
mod skills;
mod snapshots;
mod tasks;
mod tenancy;
mod traces;
mod upstream_real;
