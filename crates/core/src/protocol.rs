//! The wire: what crosses the sandbox channel (the frames of `docs/protocol.md`) and the seam
//! between the two sides of the bridge, [`ExecBinding`] and [`RpcHandler`]. `sandbox` runs code
//! and carries frames; `upstream` answers the sandbox's RPCs; neither knows the other, both know
//! this module, and `server` joins them.
//!
//! Everything decoded here comes from inside the sandbox and is untrusted: decoding never panics,
//! oversize lines are refused before they are parsed, and unknown frame types decode to
//! [`SandboxFrame::Unknown`] so the caller can log and drop them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Answers the RPCs that one exec's code sends. Errors are messages for the model: they say what
/// was wrong and what to do.
#[async_trait::async_trait]
pub trait RpcHandler: Send + Sync {
    /// The answer to `method`, or the failure the runtime raises (its message, and the kind
    /// that picks the exception class: a refusal must stay a `ToolDenied` through every handler
    /// that wraps another, so the failure is typed, never a bare string).
    async fn handle(&self, method: &str, params: Value) -> Result<Value, RpcFailure>;

    /// The exec's code runs in `interpreter`: called once per exec before it runs, so what a
    /// handler remembers per session can be tied to one interpreter (its container's id) and
    /// forgotten when the session gets another. No default: a handler in front of another
    /// passes it on, and one that keeps nothing per interpreter says so.
    fn on_interpreter(&self, interpreter: &Interpreter);
}

/// The interpreter an exec runs in, as the host knows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Interpreter {
    /// The container's id.
    pub id: String,
    /// The host directory mounted read-only at [`PACKAGES_DIR`] in it, where the bridge puts
    /// what the code installs (`runtime.install`); `None` where there is none (tests).
    pub packages: Option<std::path::PathBuf>,
    /// What the interpreter said of itself in `ready`, before any code ran.
    pub target: Option<Target>,
}

/// Makes a new interpreter ready for its session after `ready` and before its first call
/// (`packages.preinstall`); `server`'s side implements it, `sandbox` calls it for every new
/// sandbox, pooled ones too. What it returns are notices for the session's first call.
#[async_trait::async_trait]
pub trait Provision: Send + Sync {
    async fn provision(&self, interpreter: &Interpreter) -> Vec<String>;
}

/// Where installed packages are in every sandbox: a read-only mount, on `sys.path` after the
/// image's own directories.
pub const PACKAGES_DIR: &str = "/opt/packages";

/// What a sandbox's interpreter is, for choosing wheels for it: said in its `ready` frame,
/// before any of the code's runs, so it describes the image.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Target {
    /// `platform.python_version()`, e.g. `3.14.1`.
    #[serde(default)]
    pub python: String,
    /// `platform.machine()`, e.g. `x86_64`.
    #[serde(default)]
    pub machine: String,
    /// `os.confstr("CS_GNU_LIBC_VERSION")`, e.g. `glibc 2.41`; empty for another libc.
    #[serde(default)]
    pub libc: String,
    /// The distributions in the image: `[name, version]`, from their `.dist-info` names.
    #[serde(default)]
    pub dists: Vec<(String, String)>,
}

/// A failed RPC as the sandbox gets it: the message, and a `kind` the runtime maps to an
/// exception class (`"denied"`: `ToolDenied`, a `PermissionError`); none for every other error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcFailure {
    pub message: String,
    pub kind: Option<&'static str>,
}

impl std::fmt::Display for RpcFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for RpcFailure {
    fn from(message: String) -> Self {
        RpcFailure {
            message,
            kind: None,
        }
    }
}

/// The `kind` of an `rpc_result` refused by the user's policy or by the user when asked.
pub const RPC_DENIED: &str = "denied";

/// What an exec carries from the upstream side: the metadata sent to the runtime, and the handler
/// of that exec's RPCs.
pub struct ExecBinding {
    pub servers: Vec<LoadedServer>,
    pub discovered: Vec<DiscoveredServer>,
    pub rpc: Arc<dyn RpcHandler>,
    /// Whether saved skills exist for `rpc` to hand out (`load_skills`): the exec frame says so,
    /// and an interpreter's first exec asks only then, so an empty store costs no round trip.
    pub skills: bool,
}

impl ExecBinding {
    /// A binding with no servers and an RPC handler that answers every method with an error
    /// (for execs that need no upstream, such as `doctor`'s probe).
    pub fn empty() -> ExecBinding {
        struct NoUpstreams;
        #[async_trait::async_trait]
        impl RpcHandler for NoUpstreams {
            async fn handle(&self, method: &str, _params: Value) -> Result<Value, RpcFailure> {
                match method {
                    "list_servers" => Ok(json!([])),
                    "search_tool_docs" => Ok(json!([])),
                    _ => Err(RpcFailure::from(
                        "No MCP servers are available in this sandbox run".to_string(),
                    )),
                }
            }

            /// Nothing is kept per interpreter.
            fn on_interpreter(&self, _interpreter: &Interpreter) {}
        }
        ExecBinding {
            servers: Vec::new(),
            discovered: Vec::new(),
            rpc: Arc::new(NoUpstreams),
            skills: false,
        }
    }
}

/// Longest line the host accepts from the sandbox. Larger lines are discarded whole.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Deepest nesting of a skill's literal default value: the host checks it before it stores or
/// sends a skill (`skills::check`), the runtime before it defines one (sent in the boot frame).
pub const SKILL_DEFAULT_DEPTH: usize = 16;

/// The host's constants the runtime works with, sent in the boot frame so that each is written
/// once (the runtime refuses to start without them).
#[derive(Debug, Clone, Serialize)]
pub struct RuntimeConstants<'a> {
    /// [`MAX_FRAME_BYTES`]: the runtime refuses a request that would not fit.
    pub max_frame_bytes: usize,
    /// The largest `display()` image the host keeps; a larger one becomes a text note.
    pub max_image_bytes: usize,
    /// The directory whose files the host copies out; the runtime digests it for each result.
    pub out_dir: &'a str,
    /// Entries of that directory the host reads at most; past them the runtime gives no digest.
    pub out_entries: usize,
    /// The directory under `out_dir` where `keep` frames write.
    pub kept_dir: &'a str,
    /// [`SKILL_DEFAULT_DEPTH`].
    pub skill_default_depth: usize,
}

/// `(name, source)` pairs as a JSON object.
fn pairs_as_map<S: serde::Serializer>(pairs: &&[(&str, &str)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

/// Metadata of one upstream server loaded for an exec, with host-made aliases.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoadedServer {
    pub name: String,
    pub alias: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    pub tools: Vec<ToolMeta>,
    /// How old the tool list is, for `describe_server()`; a timestamp, not an age, so the
    /// metadata stays the same bytes from one exec to the next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<CatalogInfo>,
}

/// Where a loaded server's tool list came from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CatalogInfo {
    /// When the list was taken from the server, seconds since the epoch.
    pub updated_at: u64,
    /// `"catalog"`: read from the persisted catalog, not listed by this bridge since;
    /// `"live"`: listed by this bridge.
    pub source: String,
}

/// One tool of a loaded server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolMeta {
    pub name: String,
    pub alias: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub input_schema: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// `"ask"` or `"deny"` when the user's policy asks before a call or refuses it; left out
    /// when calls are allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The input schema rendered for the model (the upstream crate's `schema::Rendering`): the
    /// runtime builds the tool function's signature and `help()` from it. Shared with the
    /// catalog, which makes it once per tool list: a call that loads servers does not copy it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendering: Option<std::sync::Arc<Value>>,
}

/// A server the bridge knows of, loaded or not: what discovery shows without any schema.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DiscoveredServer {
    pub name: String,
    pub alias: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Host -> sandbox.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostFrame<'a> {
    Boot {
        /// The runtime's modules by name (`image/runtime/<name>.py`).
        #[serde(serialize_with = "pairs_as_map")]
        modules: &'a [(&'a str, &'a str)],
        /// The module whose `main` the loader calls.
        entry: &'a str,
        constants: RuntimeConstants<'a>,
        /// The modules' compiled code a sandbox sent (`code`), when the bridge holds it: the
        /// loader runs it instead of compiling the sources when an interpreter of its kind
        /// made it.
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<&'a RuntimeCode>,
    },
    Exec {
        id: u64,
        code: &'a str,
        /// `None` (left out): the same as the previous exec's of this session.
        #[serde(skip_serializing_if = "Option::is_none")]
        servers: Option<&'a [LoadedServer]>,
        /// `None` (left out): the same as the previous exec's of this session.
        #[serde(skip_serializing_if = "Option::is_none")]
        discovered: Option<&'a [DiscoveredServer]>,
        output_cap: usize,
        /// Saved skills exist: the interpreter defines them at its first exec that says so.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        skills: bool,
    },
    RpcResult {
        id: u64,
        ok: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// With `error`: what kind of failure, when the runtime raises a class of its own.
        #[serde(skip_serializing_if = "Option::is_none")]
        kind: Option<&'static str>,
    },
    Interrupt {
        id: u64,
    },
    /// Write `data` (base64, so that the line is 4/3 of the part whatever its characters; JSON
    /// escapes would make a control character six bytes) to `path` under `/workspace/out` (a
    /// part of exec `id`'s output that was too long for its result, kept whole for the next
    /// call's code to read). Sent after the exec's result, before the next exec; answered by a
    /// `kept` frame.
    Keep {
        id: u64,
        path: &'a str,
        data: String,
    },
    /// Send `/workspace/out` as a tar in `tar` frames (under gVisor, where the engine cannot
    /// read the container's tmpfs): at most `limit` bytes of tar, for at most `timeout` seconds.
    /// Sent after exec `id`'s result, before the next exec.
    Files {
        id: u64,
        limit: u64,
        timeout: u64,
    },
    /// Write the session's state as a snapshot, in `snap` frames of this id, at most `limit`
    /// bytes (docs/protocol.md, "Snapshots"). Sent between execs only.
    Snapshot {
        id: u64,
        limit: u64,
    },
    /// A snapshot of `size` bytes follows in `restore_data` frames: restore it. Sent to a fresh
    /// sandbox of the snapshot's own session, before its first exec; answered by `restored`.
    Restore {
        id: u64,
        size: u64,
    },
    /// The next bytes (base64) of the snapshot a `restore` frame announced; `end` on the last.
    RestoreData {
        id: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        end: bool,
    },
}

impl HostFrame<'_> {
    /// One line of JSON, newline-terminated.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).expect("host frames always serialize");
        line.push(b'\n');
        line
    }
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The error of a failed exec, as the runtime reports it (user frames only).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExecError {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub traceback: String,
}

/// How an exec ended, as the runtime reports it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ExecStatus {
    Ok,
    Error,
    Interrupted,
}

/// The kernel a sandbox runs on, as its runtime read it at boot (`ready`): `uname`'s release
/// and version, and the first line of `/proc/version`. Under `isolation = "gvisor"` the host
/// refuses a sandbox whose kernel is not gVisor's (`sandbox::kernel`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct KernelSeen {
    #[serde(default)]
    pub release: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub proc_version: String,
}

/// The runtime's modules compiled by a sandbox's interpreter (docs/protocol.md, "Boot"): the
/// `code` frame a sandbox sends when its loader compiled them, and the boot frame's `code`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RuntimeCode {
    /// The interpreter's magic number (`importlib.util.MAGIC_NUMBER`), in hex: the code is
    /// used only by an interpreter whose number is the same.
    pub magic: String,
    /// Each module's code object, `marshal`led, in base64, by module name.
    pub modules: std::collections::BTreeMap<String, String>,
}

/// Sandbox -> host.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SandboxFrame {
    /// The runtime's compiled code: taken only as a fresh sandbox's first frame.
    Code(RuntimeCode),
    Ready {
        #[serde(default)]
        python: String,
        /// What the interpreter is, for the wheels installed into it (absent from an older
        /// runtime's frame).
        #[serde(default)]
        target: Option<Target>,
        /// The kernel the runtime saw at boot, before any code of the user's ran.
        #[serde(default)]
        kernel: Option<KernelSeen>,
        /// Whether the loader compiled the runtime from its sources (the boot frame carried no
        /// code this interpreter could run).
        #[serde(default)]
        compiled: bool,
    },
    Output {
        id: u64,
        stream: Stream,
        data: String,
    },
    Display {
        id: u64,
        mime: String,
        data: String,
    },
    Rpc {
        id: u64,
        exec: u64,
        method: String,
        #[serde(default)]
        params: Value,
    },
    Result {
        id: u64,
        status: ExecStatus,
        #[serde(default)]
        value: Option<String>,
        #[serde(default)]
        error: Option<ExecError>,
        #[serde(default)]
        truncated: Option<u64>,
        /// A digest of what `/workspace/out` holds when the exec ended (names, types, sizes,
        /// times; `"empty"` when there is nothing), so that the host copies it out only when
        /// it changed. The sandbox could lie: it would only withhold its own files.
        #[serde(default)]
        out: Option<String>,
    },
    /// The answer to a `keep` frame: `error` says why the file could not be written, and `out`
    /// is the digest of `/workspace/out` after it (as in `result`).
    Kept {
        id: u64,
        #[serde(default)]
        error: Option<String>,
        #[serde(default)]
        out: Option<String>,
    },
    /// One piece of the tar of `/workspace/out` that a `files` frame asked for: `data` is the
    /// next bytes (base64), `end` marks the last frame, `error` why the runtime stopped early.
    /// The host judges the tar exactly as the engine's archive (`sandbox::files::extract`).
    Tar {
        id: u64,
        #[serde(default)]
        data: Option<String>,
        #[serde(default)]
        end: bool,
        #[serde(default)]
        error: Option<String>,
    },
    /// One piece of a snapshot (`snapshot` frame, or `runtime.fork()` during exec `id`): `data`
    /// is the next bytes (base64); the last frame has `end`, what the runtime says of the
    /// snapshot (`info`: names kept and lost, sizes) and, when it wrote none, `error`.
    Snap {
        id: u64,
        #[serde(default)]
        data: Option<String>,
        #[serde(default)]
        end: bool,
        #[serde(default)]
        error: Option<String>,
        #[serde(default)]
        info: Option<Value>,
    },
    /// The answer to a restore: the names restored and those lost, or why none were.
    Restored {
        id: u64,
        #[serde(default)]
        names: Vec<Value>,
        /// Names restored past the ones listed.
        #[serde(default)]
        more_names: u64,
        #[serde(default)]
        lost: Vec<Value>,
        #[serde(default)]
        modules: Vec<Value>,
        #[serde(default)]
        error: Option<String>,
    },
    /// The runtime's own diagnostics (a frame it ignored, an interrupt it had to signal again).
    /// The sandbox can send any number of these: the host logs them at debug level only,
    /// shortened, so they cost nothing at the default level.
    Log {
        #[serde(default)]
        level: String,
        #[serde(default)]
        message: String,
    },
    #[serde(other)]
    Unknown,
}

/// Why a line from the sandbox was not a frame.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("not a frame: {0}")]
    Malformed(String),
}

/// Decode one line (without its newline) from the sandbox.
pub fn decode(line: &[u8]) -> Result<SandboxFrame, FrameError> {
    if line.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(line.len()));
    }
    // serde would also read an internally tagged enum from an array (`["result", 1, "ok"]`);
    // a frame is a JSON object and nothing else (found by fuzz/fuzz_targets/frame_decoder.rs).
    if line.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(FrameError::Malformed("a frame is a JSON object".into()));
    }
    serde_json::from_slice(line).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Splits the sandbox's byte stream into lines, whatever the chunking, holding at most `max`
/// bytes: a longer line is discarded whole (its start and its rest), never cut into pieces that
/// could decode as frames of their own.
pub struct LineSplitter {
    max: usize,
    line: Vec<u8>,
    discarding: bool,
    /// The last `feed` returned `line`: clear it before the next byte.
    done: bool,
}

/// What one [`LineSplitter::feed`] completed.
#[derive(Debug, PartialEq)]
pub enum Split<'a> {
    /// A whole line, without its newline (possibly empty).
    Line(&'a [u8]),
    /// A line just went over the limit; the rest of it up to its newline will be dropped.
    Oversize,
}

impl LineSplitter {
    pub fn new(max: usize) -> Self {
        LineSplitter {
            max,
            line: Vec::new(),
            discarding: false,
            done: false,
        }
    }

    /// Take bytes from the front of `rest`, up to and including its first newline, and say what
    /// that completed. Call until `rest` is empty.
    pub fn feed<'s>(&'s mut self, rest: &mut &[u8]) -> Option<Split<'s>> {
        if std::mem::take(&mut self.done) {
            self.line.clear();
        }
        let (piece, complete) = match rest.iter().position(|b| *b == b'\n') {
            Some(p) => (&rest[..p], true),
            None => (*rest, false),
        };
        *rest = if complete {
            &rest[piece.len() + 1..]
        } else {
            &[]
        };
        let mut went_over = false;
        if !self.discarding {
            if self.line.len() + piece.len() > self.max {
                self.line.clear();
                self.line.shrink_to(64 * 1024);
                self.discarding = true;
                went_over = true;
            } else {
                self.line.extend_from_slice(piece);
            }
        }
        if complete {
            let discarded = std::mem::take(&mut self.discarding);
            self.done = true;
            if !discarded {
                return Some(Split::Line(&self.line));
            }
        }
        went_over.then_some(Split::Oversize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line the splitter completes, for `data` fed in chunks of `chunk` bytes.
    fn split_all(data: &[u8], max: usize, chunk: usize) -> (Vec<Vec<u8>>, usize) {
        let mut s = LineSplitter::new(max);
        let (mut lines, mut over) = (Vec::new(), 0);
        for c in data.chunks(chunk) {
            let mut rest = c;
            while !rest.is_empty() {
                match s.feed(&mut rest) {
                    Some(Split::Line(l)) => lines.push(l.to_vec()),
                    Some(Split::Oversize) => over += 1,
                    None => {}
                }
            }
        }
        (lines, over)
    }

    #[test]
    fn the_splitter_keeps_whole_lines_and_drops_long_ones_whole() {
        let data = b"a\n\n0123456789\n01234567890123\nb\nunterminated";
        for chunk in [1, 2, 5, 13, 100] {
            let (lines, over) = split_all(data, 10, chunk);
            let want: Vec<&[u8]> = vec![b"a", b"", b"0123456789", b"b"];
            assert_eq!(lines, want, "chunk {chunk}");
            // The long line, and the unterminated tail once it passed 10 bytes.
            assert_eq!(over, 2, "chunk {chunk}");
        }
    }

    #[test]
    fn decodes_known_frames_and_tolerates_unknown() {
        let f = decode(br#"{"type":"output","id":3,"stream":"stdout","data":"hi\n"}"#).unwrap();
        assert_eq!(
            f,
            SandboxFrame::Output {
                id: 3,
                stream: Stream::Stdout,
                data: "hi\n".into()
            }
        );
        assert_eq!(
            decode(br#"{"type":"nope","x":1}"#).unwrap(),
            SandboxFrame::Unknown
        );
    }

    #[test]
    fn refuses_garbage_and_oversize() {
        assert!(matches!(
            decode(b"\x00\xffgarbage"),
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            decode(br#"{"type":"result"}"#),
            Err(FrameError::Malformed(_))
        ));
        // Regression (fuzzing): arrays decoded as frames through serde's sequence form.
        for line in [
            &br#"["type"]"#[..],
            br#"["output", 3, "stdout", "x"]"#,
            br#"["result", 1, "ok"]"#,
            b"\"result\"",
            b"",
        ] {
            assert!(
                matches!(decode(line), Err(FrameError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        let big = vec![b' '; MAX_FRAME_BYTES + 1];
        assert_eq!(decode(&big), Err(FrameError::TooLarge(MAX_FRAME_BYTES + 1)));
    }

    #[test]
    fn host_frames_are_single_lines() {
        let line = HostFrame::Exec {
            id: 1,
            code: "a\nb",
            servers: Some(&[]),
            discovered: None,
            output_cap: 10,
            skills: false,
        }
        .to_line();
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        assert!(line.ends_with(b"\n"));
        // Left out, not null: the runtime reads absence as "unchanged".
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["servers"], serde_json::json!([]));
        assert!(v.get("discovered").is_none(), "{v}");
        assert!(v.get("skills").is_none(), "left out when false: {v}");
    }
}
