//! `Boxed`: the future a crate's async entry point returns to the crates above it.
//!
//! An `async fn`'s body is compiled where it is awaited, not where it is written, and a release
//! build shares no instantiation between crates: every crate above that awaited
//! `Sandbox::run` compiled the sandbox's whole call chain again (the top crate's object code
//! held ~1.2 MB of the lower crates' `async fn` bodies, BENCHMARKS.md "The build"). An entry
//! point that returns `Boxed` from a plain, never-inlined function is compiled once, in its own
//! crate; a caller compiles a call and a poll through a vtable. One allocation per call, on
//! paths that start containers or servers.

use std::future::Future;
use std::pin::Pin;

/// A boxed, `Send` future: what an entry point of a lower crate returns.
pub type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
