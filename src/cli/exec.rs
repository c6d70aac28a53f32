//! `exec`: run code once in a fresh sandbox, printing its output as it comes.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use super::{Paint, load_bar};
use crate::config::Config;
use crate::protocol::Stream;
use crate::sandbox::{ExecRequest, Outcome, Sandbox};
use crate::upstream::{Hinted as _, Upstreams};

/// Why `exec` has no code to run.
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error("give the code as an argument or with -f, not both")]
    Both,
    #[error("cannot read {}: {source}", .path.display())]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read stdin: {0}")]
    Stdin(std::io::Error),
}

fn read_code(code: Option<String>, file: Option<PathBuf>) -> Result<String, CodeError> {
    match (code, file) {
        (Some(_), Some(_)) => Err(CodeError::Both),
        (Some(c), None) => Ok(c),
        (None, Some(f)) => {
            std::fs::read_to_string(&f).map_err(|source| CodeError::File { path: f, source })
        }
        (None, None) => {
            if std::io::stdin().is_terminal() {
                eprintln!("(reading code from stdin; end with Ctrl-D)");
            }
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(CodeError::Stdin)?;
            Ok(s)
        }
    }
}

/// Set-up failures exit with 2; the code's own outcome gives 0, 1 or 124.
pub(super) async fn exec(
    config: Arc<Config>,
    ups: Upstreams,
    code: Option<String>,
    file: Option<PathBuf>,
    servers: Vec<String>,
) -> ExitCode {
    let code = match read_code(code, file) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let binding = match ups.load(&servers).await {
        Ok(b) => b,
        Err(e) => {
            ups.shutdown().await;
            eprintln!("error: {}", e.message());
            return ExitCode::from(2);
        }
    };
    let sandbox = Sandbox::new(config.clone());
    let bar = load_bar(&config);
    if let Some((_, report)) = &bar {
        sandbox.set_load_progress(report.clone());
    }
    let err_paint = Paint {
        on: std::io::stderr().is_terminal(),
    };
    let sink: crate::sandbox::OutputSink = Arc::new(move |stream, data: &str| match stream {
        Stream::Stdout => {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(data.as_bytes());
            let _ = o.flush();
        }
        Stream::Stderr => {
            let _ = std::io::stderr().lock().write_all(data.as_bytes());
        }
    });
    let req = ExecRequest {
        code,
        timeout: config.timeout.0,
        max_timeout: config.max_timeout.0,
        output_cap: config.output_cap.0 as usize,
        binding,
        cancel: tokio_util::sync::CancellationToken::new(),
        on_output: Some(sink),
    };
    let session = format!("exec-{}", std::process::id());
    let result = sandbox.run(&session, false, req).await;
    if let Some((bar, _)) = bar {
        bar.finish_and_clear();
    }
    sandbox.shutdown().await;
    ups.shutdown().await;
    let o = match result {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{}", err_paint.red(&format!("error: {}", e.with_hint())));
            return ExitCode::from(2);
        }
    };
    if let Some(v) = &o.value {
        println!("{v}");
    }
    if !o.images.is_empty() {
        println!(
            "{}",
            Paint {
                on: std::io::stdout().is_terminal()
            }
            .dim(&format!(
                "[{} image(s) displayed; use run_python over MCP to receive them]",
                o.images.len()
            ))
        );
    }
    if let Some(e) = &o.error {
        let text = if e.traceback.is_empty() {
            format!("{}: {}", e.kind, e.message)
        } else {
            e.traceback.trim_end().to_string()
        };
        eprintln!("{}", err_paint.red(&text));
    }
    for n in &o.notices {
        eprintln!("{}", err_paint.dim(&format!("[bridge] {n}")));
    }
    match o.outcome {
        Outcome::Ok => ExitCode::SUCCESS,
        Outcome::Timeout => ExitCode::from(124),
        _ => ExitCode::FAILURE,
    }
}
