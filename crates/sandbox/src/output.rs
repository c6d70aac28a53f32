//! What one exec produced, collected under the output cap, and how it ended.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bridge_core::protocol::{ExecError, Stream};

/// How an exec ended, from the bridge's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The code ran to the end.
    Ok,
    /// The code raised.
    Error,
    /// The time limit expired; the code was interrupted (or killed, see `session_reset`).
    Timeout,
    /// The client cancelled the call.
    Cancelled,
    /// The container died (out of memory, killed); the session was reset.
    Crashed,
}

/// Everything an exec produced.
#[derive(Debug, Clone)]
pub struct ExecOutcome {
    /// How the exec ended.
    pub outcome: Outcome,
    /// What the code printed, within the output cap.
    pub stdout: String,
    /// What the code wrote to stderr, within the output cap.
    pub stderr: String,
    /// The last expression's rendering, if it had one.
    pub value: Option<String>,
    /// The exception the code raised, if any.
    pub error: Option<ExecError>,
    /// `(mime, base64 data)` of each displayed image.
    pub images: Vec<(String, String)>,
    /// Files of `/workspace/out` new or changed in this call, kept on the host.
    pub files: Vec<super::files::OutFile>,
    /// How long the exec took, from the code's sending to its end.
    pub duration: Duration,
    /// Output bytes dropped by the output cap.
    pub truncated: u64,
    /// Sentences for the model about what the bridge did (interrupts, resets, limits).
    pub notices: Vec<String>,
    /// The interpreter's state is gone; the next call starts fresh.
    pub session_reset: bool,
    /// Parts too long for the result, kept whole as files (see [`Fit`]).
    pub kept: Vec<Kept>,
    /// How many of the first `files` the bridge named (displayed images kept as files): their
    /// links cost the budget nothing the code chose.
    pub bridge_named_files: usize,
    /// `"live"` when the call's session was taken from the bridge before this one
    /// (`sandbox::parking`).
    pub resumed: Option<&'static str>,
    /// With `resumed: "snapshot"`: the names its snapshot could not keep or bring back, as
    /// `name (type)`.
    pub lost: Vec<String>,
}

impl ExecOutcome {
    /// An `ok` outcome that printed `stdout` in 3 ms, for the tests of what is made of outcomes
    /// (here and in the crates above: not behind `cfg(test)`, which a dependent's tests do not
    /// see).
    #[doc(hidden)]
    pub fn printed(stdout: &str) -> ExecOutcome {
        ExecOutcome {
            outcome: Outcome::Ok,
            stdout: stdout.into(),
            stderr: String::new(),
            value: None,
            error: None,
            images: vec![],
            files: vec![],
            duration: Duration::from_millis(3),
            truncated: 0,
            notices: vec![],
            session_reset: false,
            kept: vec![],
            bridge_named_files: 0,
            resumed: None,
            lost: Vec::new(),
        }
    }
}

/// A part of an outcome that can be too long to return whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// What the code printed.
    Stdout,
    /// What the code wrote to stderr.
    Stderr,
    /// The last expression's rendering.
    Value,
    /// The exception's traceback.
    Traceback,
}

impl Part {
    /// Every part, in the order a result shows them.
    pub const ALL: [Part; 4] = [Part::Stdout, Part::Stderr, Part::Value, Part::Traceback];

    /// The part's name in a result and a kept file's name.
    pub fn name(self) -> &'static str {
        match self {
            Part::Stdout => "stdout",
            Part::Stderr => "stderr",
            Part::Value => "value",
            Part::Traceback => "traceback",
        }
    }

    /// This part of `o` (empty when it has none).
    pub fn of(self, o: &ExecOutcome) -> &str {
        match self {
            Part::Stdout => &o.stdout,
            Part::Stderr => &o.stderr,
            Part::Value => o.value.as_deref().unwrap_or(""),
            Part::Traceback => o.error.as_ref().map_or("", |e| e.traceback.as_str()),
        }
    }

    /// Where the part is, to be replaced by a preview.
    pub fn of_mut(self, o: &mut ExecOutcome) -> Option<&mut String> {
        match self {
            Part::Stdout => Some(&mut o.stdout),
            Part::Stderr => Some(&mut o.stderr),
            Part::Value => o.value.as_mut(),
            Part::Traceback => o.error.as_mut().map(|e| &mut e.traceback),
        }
    }
}

/// Which parts of a finished exec are too long for its result: the caller's measure (the
/// server's token budget; the sandbox counts no tokens). The session asks it before it lets go
/// of the interpreter, and keeps each part it names as a file, so that nothing is lost when the
/// result carries only a preview.
pub trait Fit: Send + Sync {
    /// The parts of `o` too long to return whole.
    fn over(&self, o: &ExecOutcome) -> Vec<Part>;
}

/// A [`Fit`] for an exec, and the session name its files' URIs carry.
#[derive(Clone)]
pub struct Spill {
    /// What judges the parts' length.
    pub fit: Arc<dyn Fit>,
    /// The session the kept parts belong to (their URIs name it).
    pub key: bridge_core::identity::SessionKey,
}

/// A part kept whole: on the host (`file`, readable with `resources/read`) and, unless
/// `in_sandbox` says why not, under `/workspace/out/.outputs/` for the next call's code.
#[derive(Debug, Clone)]
pub struct Kept {
    /// Which part.
    pub part: Part,
    /// The file on the host.
    pub file: super::files::OutFile,
    /// Whether the sandbox has it too, and why not.
    pub in_sandbox: Result<(), NotKept>,
}

/// Why a part kept on the host is not under `/workspace/out/.outputs/` too ([`Kept`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotKept {
    /// The sandbox's channel closed.
    #[error("the sandbox is gone")]
    Gone,
    /// The sandbox did not answer within this many seconds.
    #[error("the sandbox did not answer within {0}s")]
    NoAnswer(u64),
    /// The sandbox's runtime could not write it (what it said).
    #[error("{0}")]
    Refused(String),
}

/// The outcome of a call cancelled before its code was sent (it waited in line behind another
/// call of its session): cancelled, with nothing run and the session untouched.
pub(super) fn not_started(notices: Vec<String>) -> ExecOutcome {
    let mut o = Collector::new(0).finish(Outcome::Cancelled, Instant::now(), notices);
    o.duration = Duration::ZERO;
    o
}

/// Streamed output of a running exec, for progress notifications.
pub type OutputSink = Arc<dyn Fn(Stream, &str) + Send + Sync>;

/// A sentence naming the limit an error comes from, so the model knows what happened.
pub(super) fn limit_hint(e: &ExecError, pids: u32) -> Option<String> {
    let m = format!("{} {}", e.kind, e.message);
    if m.contains("Resource temporarily unavailable") || m.contains("can't start new thread") {
        return Some(format!(
            "the sandbox's process/thread limit of {pids} was reached (pids); use fewer processes or threads"
        ));
    }
    if e.kind == "MemoryError" {
        return Some(
            "the sandbox's memory limit was reached (MemoryError); work on smaller pieces of data"
                .into(),
        );
    }
    None
}

/// Collects one exec's output, enforcing the output cap on the host side too: a runtime that
/// ignores the cap cannot make the bridge hold more than twice it.
pub(super) struct Collector {
    cap: usize,
    stdout: String,
    stderr: String,
    /// Bytes beyond the cap, per stream: we keep the last `cap/2` of them.
    tails: [VecDeque<u8>; 2],
    dropped: [u64; 2],
    pub(super) truncated: u64,
    pub(super) value: Option<String>,
    pub(super) images: Vec<(String, String)>,
}

impl Collector {
    pub(super) fn new(cap: usize) -> Self {
        Collector {
            cap: cap.max(1024),
            stdout: String::new(),
            stderr: String::new(),
            tails: Default::default(),
            dropped: [0; 2],
            truncated: 0,
            value: None,
            images: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, stream: Stream, data: &str) {
        let i = stream as usize;
        let head = if i == 0 {
            &mut self.stdout
        } else {
            &mut self.stderr
        };
        // The host keeps up to 2x the cap per stream: the runtime already trims to the cap.
        let room = (self.cap * 2).saturating_sub(head.len());
        if data.len() <= room {
            head.push_str(data);
            return;
        }
        let cut = bridge_core::text::floor_char_boundary(data, room);
        head.push_str(&data[..cut]);
        let rest = &data.as_bytes()[cut..];
        let tail = &mut self.tails[i];
        tail.extend(rest);
        let keep = self.cap / 2;
        while tail.len() > keep {
            let excess = tail.len() - keep;
            tail.drain(..excess);
            self.dropped[i] += excess as u64;
        }
    }

    pub(super) fn finish(
        mut self,
        outcome: Outcome,
        started: Instant,
        notices: Vec<String>,
    ) -> ExecOutcome {
        for i in 0..2 {
            let mut tail = std::mem::take(&mut self.tails[i]);
            if tail.is_empty() {
                continue;
            }
            let tail = String::from_utf8_lossy(tail.make_contiguous()).into_owned();
            let head = if i == 0 {
                &mut self.stdout
            } else {
                &mut self.stderr
            };
            if self.dropped[i] > 0 {
                head.push_str(&format!(
                    "\n… [output truncated: {} bytes omitted] …\n",
                    self.dropped[i]
                ));
            }
            head.push_str(&tail);
            self.truncated += self.dropped[i];
        }
        ExecOutcome {
            outcome,
            stdout: self.stdout,
            stderr: self.stderr,
            value: self.value,
            error: None,
            images: self.images,
            files: Vec::new(),
            duration: started.elapsed(),
            truncated: self.truncated,
            notices,
            session_reset: false,
            kept: Vec::new(),
            bridge_named_files: 0,
            resumed: None,
            lost: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collector_keeps_head_and_tail() {
        let mut c = Collector::new(1024);
        let big = "x".repeat(10_000) + "END";
        c.push(Stream::Stdout, &big);
        let o = c.finish(Outcome::Ok, Instant::now(), vec![]);
        assert!(o.stdout.starts_with("xxx"));
        assert!(o.stdout.ends_with("END"));
        assert!(o.stdout.contains("output truncated"));
        assert!(o.truncated > 0);
        assert!(o.stdout.len() < 4096);
    }

    #[test]
    fn limit_errors_are_named() {
        let e = ExecError {
            kind: "BlockingIOError".into(),
            message: "[Errno 11] Resource temporarily unavailable".into(),
            traceback: String::new(),
        };
        assert!(limit_hint(&e, 64).unwrap().contains("limit of 64"));
        let e = ExecError {
            kind: "ValueError".into(),
            message: "x".into(),
            traceback: String::new(),
        };
        assert_eq!(limit_hint(&e, 64), None);
    }
}
