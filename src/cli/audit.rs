//! `audit [--follow] [--session S] [--json]`: the audit log for people (a table: time,
//! session, what ran, how it was decided and ended) or as its JSON lines. Rotated files are read
//! oldest first; `--follow` then waits for new records, across rotations.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use bridge_core::audit::rotated_files;
use bridge_core::config;
use bridge_core::text::visible;

/// How often `--follow` looks for new records.
const POLL: Duration = Duration::from_millis(200);
/// Longest line read; a longer one (not written by the bridge) is skipped.
const MAX_LINE: usize = 4 << 20;

/// What to print and how.
pub(super) struct Options {
    pub follow: bool,
    pub session: Option<String>,
    pub json: bool,
}

pub(super) fn audit(loaded: &config::Loaded, opts: Options) -> ExitCode {
    let c = &loaded.config;
    let Some(path) = c.audit.file(&c.state_dir) else {
        eprintln!(
            "the audit log is off (audit.path = off, from {}); set audit.path to a file, or unset it for <state_dir>/audit.jsonl",
            loaded.source_of("audit.path")
        );
        return ExitCode::FAILURE;
    };
    let mut out = Printer {
        out: std::io::stdout().lock(),
        opts: &opts,
        skipped: 0,
        header: false,
    };
    let files = rotated_files(&path);
    if files.is_empty() && !opts.follow {
        eprintln!("no audit records yet: {} does not exist", path.display());
        return ExitCode::SUCCESS;
    }
    // The rotated files whole, then the current one through a handle `--follow` keeps reading.
    let mut warned = false;
    for f in files.iter().filter(|f| **f != path) {
        if let Some(mut file) = open_log(f, &mut warned)
            && out.read_all(&mut file).is_err()
        {
            return ExitCode::SUCCESS;
        }
    }
    let mut current = open_log(&path, &mut warned);
    if let Some(r) = current.as_mut()
        && out.read_all(r).is_err()
    {
        return ExitCode::SUCCESS;
    }
    out.header();
    if !opts.follow {
        out.report_skipped();
        return ExitCode::SUCCESS;
    }
    let _ = out.out.flush();
    loop {
        std::thread::sleep(POLL);
        let mut reopen = false;
        let on_disk = std::fs::metadata(&path).ok();
        if let Some(r) = current.as_mut() {
            // What was appended since, then: is the path still this file?
            if out.read_all(r).is_err() {
                return ExitCode::SUCCESS;
            }
            let ours = r.get_ref().metadata().ok();
            reopen = match (ours, &on_disk) {
                (Some(a), Some(b)) => a.ino() != b.ino() || a.dev() != b.dev(),
                (_, None) => false,
                (None, Some(_)) => true,
            };
            if reopen && out.read_all(r).is_err() {
                return ExitCode::SUCCESS;
            }
        } else if on_disk.is_some() {
            reopen = true;
        }
        if reopen {
            current = open_log(&path, &mut warned);
            if let Some(r) = current.as_mut()
                && out.read_all(r).is_err()
            {
                return ExitCode::SUCCESS;
            }
        }
        if out.out.flush().is_err() {
            return ExitCode::SUCCESS;
        }
    }
}

/// A log file to read, opened as the bridge opens its state files (`bridge_core::statefile`): a
/// FIFO, device or symbolic link in its place is skipped with a warning (once), never waited
/// on or followed.
fn open_log(path: &Path, warned: &mut bool) -> Option<BufReader<File>> {
    match bridge_core::statefile::open_read(path) {
        Ok(f) => Some(BufReader::new(f)),
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound && !std::mem::replace(warned, true) {
                eprintln!("warning: skipped {}: {e}", path.display());
            }
            None
        }
    }
}

struct Printer<'a, W: Write> {
    out: W,
    opts: &'a Options,
    /// Lines that were not records (not JSON, or too long).
    skipped: u64,
    header: bool,
}

impl<W: Write> Printer<'_, W> {
    /// Print every complete line `r` has now; a partial last line (a record being written) is
    /// left for the next read. An error is stdout gone (a closed pipe): stop.
    fn read_all<R: Read + std::io::Seek>(&mut self, r: &mut BufReader<R>) -> std::io::Result<()> {
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = r
                .by_ref()
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)?;
            if n == 0 {
                return Ok(());
            }
            if line.last() != Some(&b'\n') {
                if line.len() > MAX_LINE {
                    self.skipped += 1;
                    // The rest of this overlong line, up to its end.
                    let mut rest = Vec::new();
                    r.read_until(b'\n', &mut rest)?;
                    continue;
                }
                // Incomplete: step back so the next read sees it whole.
                r.seek_relative(-(n as i64))?;
                return Ok(());
            }
            self.line(&line)?;
        }
    }

    fn line(&mut self, raw: &[u8]) -> std::io::Result<()> {
        let Ok(rec) = serde_json::from_slice::<Value>(raw) else {
            self.skipped += 1;
            return Ok(());
        };
        if let Some(s) = &self.opts.session
            && rec["session"].as_str() != Some(s.as_str())
        {
            return Ok(());
        }
        if self.opts.json {
            return self.out.write_all(raw);
        }
        self.header();
        writeln!(self.out, "{}", row(&rec))
    }

    fn header(&mut self) {
        if !self.opts.json && !self.header {
            self.header = true;
            let _ = writeln!(
                self.out,
                "{:19}  {:16}  {:40}  {:24}  {:>7}",
                "TIME (UTC)", "SESSION", "WHAT", "RESULT", "MS"
            );
        }
    }

    fn report_skipped(&self) {
        if self.skipped > 0 {
            eprintln!(
                "{} lines were not audit records and were skipped",
                self.skipped
            );
        }
    }
}

/// One record as a table row: time, session, what ran, how it was decided and ended, how
/// long it took, and the rule that decided a tool call. Every text of the record is shown
/// through `text::visible`: tool and server names, error types and sessions can be the code's
/// or a client's choice, and a terminal must not act on them (a row erasing the rows above it
/// or printing a fake one); `--json` prints the records as they are.
fn row(r: &Value) -> String {
    let s = |k: &str| visible(r[k].as_str().unwrap_or(""));
    let time: String = s("ts").replacen('T', " ", 1).chars().take(19).collect();
    // A list of names, each made visible.
    let names = |k: &str| -> Vec<String> {
        r[k].as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(|v| visible(v).into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    // `decision → status`, and the error type when there is one.
    let decided = |first: &str| {
        let mut result = first.to_string();
        if let Some(e) = r["error_type"].as_str() {
            result.push_str(&format!(" {}", visible(e)));
        }
        result
    };
    let (what, result) = match r["kind"].as_str().unwrap_or("") {
        "exec" => {
            let servers = names("servers");
            let mut what = format!("exec {}", s("code_sha256").get(..12).unwrap_or(""));
            if !servers.is_empty() {
                what.push_str(&format!(" [{}]", servers.join(",")));
            }
            (what, decided(&s("status")))
        }
        "tool_call" => (
            format!("{}.{}", s("server"), s("tool")),
            decided(&format!("{} → {}", s("decision"), s("status"))),
        ),
        "install" => {
            let n = r["resolved"].as_array().map_or(0, Vec::len);
            (
                format!("install {} ({n} dists)", names("requested").join(",")),
                decided(&format!("{} → {}", s("decision"), s("status"))),
            )
        }
        "skill_save" => (
            format!("save_skill {}", s("skill")),
            decided(&format!("{} → {}", s("decision"), s("status"))),
        ),
        kind @ ("snapshot" | "restore" | "fork" | "session_end") => {
            let mut what = format!("{kind} {} bytes", r["size"].as_u64().unwrap_or(0));
            if let Some(to) = r["to"].as_str() {
                what = format!(
                    "fork → {} ({} bytes)",
                    visible(to),
                    r["size"].as_u64().unwrap_or(0)
                );
            }
            let mut result = format!("{} → {}", s("why"), s("status"));
            let lost = names("lost");
            if !lost.is_empty() {
                result.push_str(&format!(" lost {}", lost.join(",")));
            }
            (what, result)
        }
        _ => (s("kind").into_owned(), s("status").into_owned()),
    };
    let mut line = format!(
        "{time:19}  {:16}  {:40}  {:24}  {:>7}",
        clip(&s("session"), 16),
        clip(&what, 40),
        clip(&result, 24),
        r["duration_ms"].as_u64().unwrap_or(0)
    );
    if let Some(rule) = r["rule"].as_str() {
        line.push_str(&format!("  rule {}", visible(rule)));
    }
    // What `[policy.flows]` found: its decision and each suspect argument's source (never a
    // value; argument names are the code's choice, shown visible).
    if let Some(flow) = r["flow"]["decision"].as_str() {
        line.push_str(&format!("  flow {}", visible(flow)));
        let sources: Vec<String> = r["flow"]["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|v| visible(v).into_owned())
            .collect();
        if !sources.is_empty() {
            line.push_str(&format!(" ({})", sources.join("; ")));
        }
    }
    if let Some(n) = r["dropped_before"].as_u64() {
        line.push_str(&format!("  ({n} records lost before this one)"));
    }
    line
}

/// `s` in at most `width` characters, `…` marking a cut.
fn clip(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut c: String = s.chars().take(width - 1).collect();
    c.push('…');
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_show_what_ran_and_how_it_ended() {
        let exec = serde_json::json!({"ts": "2026-11-23T18:22:01.123Z", "kind": "exec", "session": "default",
            "code_sha256": "0123456789abcdef0123", "servers": ["time"], "status": "error",
            "error_type": "NameError", "duration_ms": 42});
        let r = row(&exec);
        assert!(r.starts_with("2026-11-23 18:22:01  default "), "{r}");
        assert!(r.contains("exec 0123456789ab [time]"), "{r}");
        assert!(r.contains("error NameError"), "{r}");
        let call = serde_json::json!({"ts": "2026-11-23T18:22:02.000Z", "kind": "tool_call", "session": "s",
            "server": "github", "tool": "delete_repo", "decision": "deny", "status": "denied",
            "rule": "github.delete_*", "duration_ms": 0, "dropped_before": 3});
        let r = row(&call);
        assert!(r.contains("github.delete_repo"), "{r}");
        assert!(r.contains("deny → denied"), "{r}");
        assert!(r.contains("rule github.delete_*"), "{r}");
        assert!(r.contains("3 records lost"), "{r}");
    }

    #[test]
    fn rows_show_the_flow_decision_and_its_sources() {
        let r = serde_json::json!({"ts": "2026-12-06T07:00:00Z", "kind": "tool_call", "session": "default",
            "server": "bank", "tool": "send_money", "decision": "deny", "status": "denied",
            "rule": "policy.flows.on_suspect = \"deny\"", "duration_ms": 0,
            "flow": {"decision": "suspect:deny",
                     "sources": ["recipient<-bank.read_mail (untrusted)", "x\u{1b}[2J<-a.b (untrusted)"]}});
        let row = row(&r);
        assert!(
            row.contains("flow suspect:deny (recipient<-bank.read_mail (untrusted); x\\x1b[2J<-a.b (untrusted))"),
            "{row}"
        );
        let clean = serde_json::json!({"kind": "tool_call", "server": "bank", "tool": "send_money",
            "decision": "allow", "status": "ok", "flow": {"decision": "clean", "sources": []}});
        assert!(row_of(&clean).ends_with("flow clean"), "{}", row_of(&clean));
        let none = serde_json::json!({"kind": "tool_call", "server": "bank", "tool": "send_money",
            "decision": "allow", "status": "ok"});
        assert!(!row_of(&none).contains("flow"), "{}", row_of(&none));
    }

    fn row_of(r: &Value) -> String {
        row(r).trim_end().to_string()
    }

    #[test]
    fn rows_show_what_a_terminal_would_act_on_as_escapes() {
        let call = serde_json::json!({"ts": "2026-11-23T18:22:02.000Z", "kind": "tool_call",
            "session": "s\u{1b}[1A", "server": "gh", "tool": "x\r\u{1b}[2K\u{1b}[1A\u{7}\u{9b}2J\u{202e}\ngithub.delete_repo",
            "decision": "allow", "status": "ok", "error_type": "E\u{1b}]0;t\u{7}", "rule": "r\u{85}",
            "duration_ms": 1});
        let r = row(&call);
        assert!(
            r.chars()
                .all(|c| (' '..='~').contains(&c) || c == '→' || c == '…'),
            "{r:?}"
        );
        assert!(r.contains(r"gh.x\r\x1b[2K\x1b[1A\x07\u{9b}2J"), "{r}");
        assert!(r.contains(r"s\x1b[1A"), "{r}");
        assert!(r.contains(r"rule r\u{85}"), "{r}");
    }

    #[test]
    fn a_partial_last_line_waits_for_its_end() {
        let opts = Options {
            follow: true,
            session: None,
            json: true,
        };
        let mut p = Printer {
            out: Vec::new(),
            opts: &opts,
            skipped: 0,
            header: false,
        };
        let data = b"{\"session\":\"a\"}\n{\"sess".to_vec();
        let mut r = BufReader::new(std::io::Cursor::new(data));
        p.read_all(&mut r).unwrap();
        assert_eq!(p.out, b"{\"session\":\"a\"}\n");
        assert_eq!(p.skipped, 0);
    }
}
