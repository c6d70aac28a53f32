//! The bridge benchmark and its load test: starts the real release binary,
//! drives it with rmcp's real client and raw JSON-RPC, against real podman and the real MCP
//! reference servers, and prints ONE Markdown table. Every figure is a median and a p95 over the
//! N repetitions named in its row; nothing here is asserted, the table is the product.
//!
//! ```text
//! cargo build --release && cargo bench --bench bridge            # full run (~2 min on 2 cores)
//! BENCH_QUICK=1 cargo bench --bench bridge                       # few repetitions, CI smoke (~40 s)
//! BENCH_ONLY=proxy,load cargo bench --bench bridge               # a subset of the sections
//! BENCH_ONLY=catalog cargo bench --bench bridge                  # first search, cold and warm catalog (also CATALOG_RUNS)
//! BENCH_ONLY=pool cargo bench --bench bridge                      # first calls with and without the pool
//! BENCH_ONLY=first-call cargo bench --bench bridge                # section 8's rows with no pause after initialize
//! BENCH_ONLY=first-call BENCH_POOL_FRESH=15 cargo bench --bench bridge  # the same, 15 bridges a row
//! BENCH_ONLY=audit cargo bench --bench bridge                     # the audit log: writer cost, calls with it on and off
//! BENCH_ONLY=hostile-http cargo bench --bench bridge              # section 9's HTTP rows only (connections, queued tasks, MCP sessions)
//! BENCH_ONLY=results cargo bench --bench bridge                   # section 12: result size, tokens and time for prints of 1 KB, 100 KB, 10 MB
//! BENCH_ONLY=packages cargo bench --bench bridge                  # section 13: installs from a local index, from the cache, statsmodels from PyPI
//! BENCH_ONLY=isolation cargo bench --bench bridge                 # section 14: runc and gVisor side by side (needs runsc)
//! BENCH_ONLY=snapshots cargo bench --bench bridge                 # section 15: snapshot and restore, empty and a 1M-row DataFrame
//! BENCH_ONLY=tracing cargo bench --bench bridge                   # section 16: calls with traces on and off
//! BENCH_ONLY=flows cargo bench --bench bridge                     # section 17: a proxied call's flow work, on and off
//! BENCH_ONLY=capacity cargo bench --bench bridge                  # section 11: sandboxes' memory and idle CPU, serve at 1/5/20 identities (~8 min)
//! BENCH_ONLY=capacity-sandboxes cargo bench --bench bridge        # section 11's sandbox rows alone (memory, idle CPU)
//! BENCH_ONLY=capacity-bounds cargo bench --bench bridge           # section 11's bounds alone: max_sessions, a busy session, 429
//! BENCH_ONLY=capacity-max-sessions cargo bench --bench bridge     # section 11's load run with max_sessions = 20 alone
//! BENCH_ONLY=capacity-sessions cargo bench --bench bridge        # section 11's idle pandas sessions up to scaling.md's figure or the first failure
//! BENCH_ONLY=capacity-starts cargo bench --bench bridge          # section 11's team's first calls alone (20 × 2 new sessions × 20 calls)
//! BENCH_CAPACITY_GVISOR=1 BENCH_ONLY=capacity-sandboxes …         # the sandbox rows under gVisor too (needs runsc)
//! BENCH_PROXY_RUNS=50 BENCH_ONLY=proxy cargo bench --bench bridge # more of one (also LOAD_RUNS, LOAD_CALLS, WARM,
//!                                                                 # CAPACITY_SECS, IDLE_SECS, CAPACITY_SANDBOXES)
//! ```
//!
//! Needs what the integration tests need: `MCP_BRIDGE_TEST_IMAGE_ARCHIVE` (the sandbox image
//! archive) and `MCP_BRIDGE_TEST_SERVERS_BIN` (where `mcp-server-everything`,
//! `mcp-server-filesystem`, `mcp-server-time` and `mcp-server-git` are), plus `podman`, `git` and
//! `python3` on PATH. A missing prerequisite stops the bench with a message; nothing is skipped.
//! The 50 "generated" servers are `benches/fixtures/catalog_server.py` started with 50 names.

// A test harness has no API (its `pub` items are for its own modules), prints what a failure
// needs, and calls libc directly on test processes; the product's lints (Cargo.toml) are for
// the crates.
#![allow(
    unreachable_pub,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::undocumented_unsafe_blocks
)]

mod audit;
mod capacity;
mod catalog;
/// The integration tests' harness: the bench shares its private-home environment.
#[path = "../../tests/e2e/common/mod.rs"]
mod common;
mod execution;
mod flows;
mod footprint;
mod harness;
mod hostile;
mod http_bounds;
mod isolation;
mod load;
mod opts;
mod packages;
mod pool;
mod proxy;
mod raw;
mod results;
mod sessions;
mod snapshots;
mod starts;
mod startup;
mod table;
mod traces;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

type Res<T> = Result<T, String>;

use audit::*;
use capacity::*;
use catalog::*;
use execution::*;
use flows::*;
use footprint::*;
use harness::*;
use hostile::*;
use http_bounds::*;
use isolation::*;
use load::*;
use opts::*;
use packages::*;
use pool::*;
use proxy::*;
use raw::*;
use results::*;
use sessions::*;
use snapshots::*;
use starts::*;
use startup::*;
use table::*;
use traces::*;

// ---------------------------------------------------------------------------------------------

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let o = Opts::from_env().with_overrides();
    let started = Instant::now();
    let bin = bridge_bin();
    if !bin.is_file() {
        fail(&format!(
            "{} does not exist: run `cargo build --release`",
            bin.display()
        ));
    }
    image_archive();
    eprintln!(
        "bench: {} mode, binary {}",
        if o.quick { "quick" } else { "full" },
        bin.display()
    );
    let fx = Fixtures::new();
    let mut t = Table::default();

    if o.wants("catalog") {
        eprintln!("bench: first search with a cold and a warm catalog…");
        catalog_figures(&o, &mut t).await;
    }

    if o.wants("tokens") || o.wants("startup") {
        eprintln!("bench: context cost and start-up…");
        context_and_startup(&o, &fx, &mut t).await;
    }
    if o.wants("pool") || o.wants("first-call") {
        eprintln!("bench: first calls and the pool…");
        pool_section(&o, &mut t).await;
    }
    let needs_live = ["exec", "proxy", "footprint", "load"]
        .iter()
        .any(|s| o.wants(s));
    if needs_live {
        let live = Live::start(Home::new(&fx.real())).await;
        eprintln!("bench: bridge under test: pid {}", live.pid);
        if o.wants("exec") {
            eprintln!("bench: execution…");
            execution(&o, &live, &mut t).await;
        }
        if o.wants("proxy") {
            eprintln!("bench: proxy…");
            proxy(&o, &live, &mut t).await;
        }
        let mut warm = Vec::new();
        if o.wants("footprint") {
            eprintln!("bench: footprint…");
            warm = warm_rss(&o, &fx).await;
        }
        let mut under_load = Vec::new();
        if o.wants("load") {
            eprintln!("bench: load test…");
            under_load = load_test(&o, &live, &mut t, "stdio").await;
            eprintln!("bench: load test over HTTP…");
            let http = Live::serve(Home::new(&fx.real())).await;
            load_test(&o, &http, &mut t, "HTTP").await;
            http.shutdown().await;
        }
        if o.wants("footprint") {
            t.section(5, "5. Footprint");
            t.samples(
                "bridge RSS with 5 warm upstreams (fresh bridge, one call to each made)",
                &warm,
                Unit::MiB,
                Target::None,
            );
            if !under_load.is_empty() {
                t.samples(
                    "bridge RSS under the load test (sampled every 50 ms)",
                    &under_load,
                    Unit::MiB,
                    Target::None,
                );
            }
            image_figures(&o, &mut t).await;
        }
        live.shutdown().await;
    }
    if o.wants("audit") {
        eprintln!("bench: audit log…");
        audit_section(&o, &mut t).await;
    }
    if o.wants("hostile") {
        eprintln!("bench: hostile sandbox…");
        hostile(&mut t).await;
    }
    if o.wants("hostile") || o.wants("hostile-http") {
        eprintln!("bench: hostile clients of serve…");
        http_bounds(&mut t).await;
    }
    if [
        "capacity",
        "capacity-sandboxes",
        "capacity-bounds",
        "capacity-max-sessions",
        "capacity-starts",
        "capacity-sessions",
    ]
    .iter()
    .any(|s| o.wants(s))
    {
        eprintln!("bench: capacity…");
        capacity(&o, &fx, &mut t).await;
    }
    if o.wants("results") {
        eprintln!("bench: results that fit the client…");
        results_section(&o, &mut t).await;
    }
    if o.wants("packages") {
        eprintln!("bench: packages on demand…");
        packages_section(&o, &mut t).await;
    }
    if o.wants("isolation") {
        eprintln!("bench: the isolation levels side by side…");
        isolation_section(&o, &fx, &mut t).await;
    }
    if o.wants("snapshots") {
        eprintln!("bench: sessions kept on disk…");
        snapshots_section(&o, &mut t).await;
    }
    if o.wants("tracing") {
        eprintln!("bench: traces on and off…");
        tracing_section(&o, &mut t).await;
    }
    if o.wants("flows") {
        eprintln!("bench: flows on and off…");
        flows_section(&o, &mut t).await;
    }
    println!();
    println!(
        "mcp-code-bridge bench ({} mode; N = samples per row; bridge RSS is the bridge process only)",
        if o.quick { "quick" } else { "full" }
    );
    println!();
    t.print();
    println!();
    println!("total bench time: {:.0} s", started.elapsed().as_secs_f64());
}
