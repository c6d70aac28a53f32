//! `servers`: the configured servers; with `--refresh`, every server started and listed into the
//! saved tool catalog.

use std::process::ExitCode;

use bridge_core::error::Hinted as _;
use bridge_upstream::Upstreams;

/// `servers`: each configured server, where it came from, and what is known of its tools.
pub(super) fn print_report(ups: &Upstreams) {
    print!("{}", ups.report());
}

/// Every server listed into the catalog, with a progress bar on stderr (a line per server when
/// stderr is not a terminal). Fails when any server could not be listed.
pub(super) async fn refresh_catalog(ups: &Upstreams) -> ExitCode {
    let total = ups.sources().servers.len();
    let bar = indicatif::ProgressBar::new(total as u64).with_message("listing tools");
    let line = |text: String| {
        if bar.is_hidden() {
            eprintln!("{text}");
        } else {
            bar.println(text);
        }
    };
    let done = ups
        .refresh_catalog(|r| {
            bar.inc(1);
            let n = bar.position();
            match &r.result {
                Ok(tools) => line(format!(
                    "[{n}/{total}] {}: {tools} tool(s) in {:.1}s",
                    r.server,
                    r.took.as_secs_f64()
                )),
                // The server's own words are in the error: shown escaped.
                Err(e) => line(format!(
                    "[{n}/{total}] {}: failed: {}",
                    r.server,
                    bridge_core::text::visible(&e.message())
                )),
            }
        })
        .await;
    bar.finish_and_clear();
    let flushed = ups.flush_catalog().await;
    ups.shutdown().await;
    let failed = done.iter().filter(|r| r.result.is_err()).count();
    if let Err(e) = flushed {
        return super::term::fail(&e, 1);
    }
    let path = ups
        .catalog_path()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    eprintln!("{} of {total} server(s) listed into {path}", total - failed);
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
