//! `exec`: run code once in a fresh sandbox, printing its output as it comes. The run is
//! audited as a `run_python` call is: one `exec` record, and a `tool_call` record for each
//! proxied call (the policy applies to them as under `run`; nobody can be asked, so `ask` is
//! `ask_fallback`).

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use super::term::{Paint, fail, load_bar};
use bridge_core::config::Config;
use bridge_core::identity::SessionKey;
use bridge_core::protocol::Stream;
use bridge_sandbox::{Outcome, Sandbox};
use bridge_server::{Bridge, RunArgs};
use bridge_upstream::{CallRelay, Upstreams};

/// Why `exec` has no code to run.
#[derive(Debug, thiserror::Error)]
pub(super) enum CodeError {
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

/// Where `exec`'s code comes from: the argument (`-` is stdin), a file, or stdin.
pub(super) struct Code {
    pub code: Option<String>,
    pub file: Option<PathBuf>,
}

impl bridge_core::error::Hinted for CodeError {}

fn read_code(Code { code, file }: Code) -> Result<String, CodeError> {
    let code = code.filter(|c| c != "-");
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
    code: Code,
    servers: Vec<String>,
    out: Option<PathBuf>,
) -> ExitCode {
    let code = match read_code(code) {
        Ok(c) => c,
        Err(e) => return fail(&e, 2),
    };
    let session = format!("exec-{}", std::process::id());
    let sandbox = Sandbox::new(config.clone());
    // A sandbox the bridge before this one parked serves this call, if it is there.
    sandbox.adopt_parked();
    let bar = load_bar(&config);
    if let Some((_, report)) = &bar {
        sandbox.set_load_progress(report.clone());
    }
    let bridge = Bridge::new(config.clone(), sandbox.clone(), ups);
    let err_paint = Paint {
        on: std::io::stderr().is_terminal(),
    };
    let sink: bridge_sandbox::OutputSink = Arc::new(move |stream, data: &str| match stream {
        Stream::Stdout => {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(data.as_bytes());
            let _ = o.flush();
        }
        Stream::Stderr => {
            let _ = std::io::stderr().lock().write_all(data.as_bytes());
        }
    });
    let args = RunArgs {
        code,
        servers,
        timeout: None,
        session: Some(session.clone()),
        reset: false,
    };
    // The one path of a call (`Bridge::execute`): servers under the policy, skills, the audit
    // records. Nobody can be asked, so `ask` is `ask_fallback`.
    let key = SessionKey::local(session);
    let result = bridge
        .execute(
            &key,
            args,
            tokio_util::sync::CancellationToken::new(),
            Some(sink),
            None,
            CallRelay::default(),
            None,
        )
        .await;
    if let Some((bar, _)) = bar {
        bar.finish_and_clear();
    }
    // Before the shutdown, which takes the session's files with it.
    let written = match (&out, &result) {
        (Some(dir), Ok(o)) => Some(write_out(dir, o, &sandbox, &key).await),
        _ => None,
    };
    bridge.shutdown().await;
    let o = match result {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{}", err_paint.red(&format!("error: {}", e.message)));
            return ExitCode::from(2);
        }
    };
    if let Some(v) = &o.value {
        println!("{v}");
    }
    let dim = |line: &str| {
        Paint {
            on: std::io::stdout().is_terminal(),
        }
        .dim(line)
    };
    match written {
        Some(Ok(paths)) => {
            for p in paths {
                // The file's name under DIR is the code's choice: shown as data, escaped.
                let path = p.display().to_string();
                println!(
                    "{}",
                    dim(&format!("[wrote {}]", bridge_core::text::visible(&path)))
                );
            }
        }
        Some(Err(e)) => {
            eprintln!("{}", err_paint.red(&format!("error: --out: {e}")));
        }
        None if !o.images.is_empty() || !o.files.is_empty() => {
            println!(
                "{}",
                dim(&format!(
                    "[{} image(s) displayed, {} file(s) in /workspace/out; --out DIR writes them there]",
                    o.images.len(),
                    o.files.len()
                ))
            );
        }
        None => {}
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
        let n = one_shot_notice(n, o.outcome, &config);
        eprintln!("{}", err_paint.dim(&format!("[bridge] {n}")));
    }
    match o.outcome {
        Outcome::Ok => ExitCode::SUCCESS,
        Outcome::Timeout => ExitCode::from(124),
        _ => ExitCode::FAILURE,
    }
}

/// Write `o`'s displayed images (`image-1.png`, ...) and the files it left in
/// `/workspace/out` (under their names there, which the copy out made safe: relative, no `..`)
/// to `dir`. The paths written, or what failed first.
async fn write_out(
    dir: &std::path::Path,
    o: &bridge_sandbox::ExecOutcome,
    sandbox: &Sandbox,
    key: &SessionKey,
) -> std::io::Result<Vec<PathBuf>> {
    use base64::Engine as _;
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let mut write = |rel: &str, bytes: &[u8]| -> std::io::Result<()> {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, bytes)?;
        written.push(path);
        Ok(())
    };
    for (i, (mime, data)) in o.images.iter().enumerate() {
        let ext = mime_guess::get_mime_extensions_str(mime)
            .and_then(|e| e.first())
            .unwrap_or(&"bin");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        write(&format!("image-{}.{ext}", i + 1), &bytes)?;
    }
    for f in &o.files {
        if let Some((_, bytes)) = sandbox.read_file(key, &f.name).await? {
            write(&f.name, &bytes)?;
        }
    }
    Ok(written)
}

/// A notice of the sandbox, as it applies to a one-shot run: there is no session to keep or
/// reset (the sandbox goes with the run), and the time limit is `--timeout`, not a `"timeout"`
/// argument. Sentences about either are left out; a timeout says how to raise the limit.
fn one_shot_notice(notice: &str, outcome: Outcome, config: &Config) -> String {
    let kept: Vec<&str> = notice
        .split_inclusive(". ")
        .flat_map(|s| s.split_inclusive("; "))
        .filter(|s| {
            let s = s.to_ascii_lowercase();
            !s.contains("session") && !s.contains("\"timeout\"") && !s.contains("next call")
        })
        .collect();
    let mut text = kept
        .concat()
        .trim_end()
        .trim_end_matches([';', ','])
        .to_string();
    if text.is_empty() {
        text = notice.to_string();
    }
    if !text.ends_with('.') {
        text.push('.');
    }
    if outcome == Outcome::Timeout {
        text.push_str(&format!(
            " Raise the limit with --timeout (at most max_timeout, {}).",
            config.max_timeout
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shot_notices_speak_of_no_session() {
        let c = Config::default();
        let t = one_shot_notice(
            "the time limit of 5s expired and the code was interrupted (KeyboardInterrupt); the session and its variables are kept. Pass a larger \"timeout\" (at most 120s) for longer work.",
            Outcome::Timeout,
            &c,
        );
        assert_eq!(
            t,
            "the time limit of 5s expired and the code was interrupted (KeyboardInterrupt). Raise the limit with --timeout (at most max_timeout, 120s)."
        );
        let k = one_shot_notice(
            "the time limit of 1s expired, and the code did not stop within 3s of KeyboardInterrupt, so its sandbox was killed. The session was reset: variables and imports are gone; the next call starts fresh.",
            Outcome::Timeout,
            &c,
        );
        assert!(!k.to_lowercase().contains("session"), "{k}");
        assert!(k.starts_with("the time limit of 1s expired, and the code did not stop within 3s of KeyboardInterrupt, so its sandbox was killed."), "{k}");
        let m = one_shot_notice("output was truncated at 1 MiB.", Outcome::Ok, &c);
        assert_eq!(m, "output was truncated at 1 MiB.");
    }
}
