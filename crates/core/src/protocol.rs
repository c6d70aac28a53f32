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
    /// Prepare `interpreter` (install `packages.preinstall` into it). Never fails: what went
    /// wrong comes back as notices, one sentence each, for the session's first call to carry;
    /// empty when all went well.
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
    /// What went wrong and what to do, for the model: the exception's message.
    pub message: String,
    /// The class the runtime raises: [`RPC_DENIED`], or another crate's kind (`"package"`,
    /// `"package_denied"`); `None` for a plain `McpError`.
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
    /// The servers loaded for this exec, with their tools: the exec frame's `servers`.
    pub servers: Vec<LoadedServer>,
    /// Every server the bridge knows of, loaded or not: the exec frame's `discovered`.
    pub discovered: Vec<DiscoveredServer>,
    /// Answers the RPCs the exec's code sends.
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
    /// The server's name as configured (`[servers.<name>]`).
    pub name: String,
    /// The Python identifier the runtime binds it as (`mcp_<alias>`), made by the host.
    pub alias: String,
    /// The configured description, for `describe_server()`; `None` when none is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The directory the server's command runs in (its entry's `cwd`), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The server's tools, in the order it listed them.
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
    /// The tool's name as the server lists it (what `call_tool` sends).
    pub name: String,
    /// The Python identifier of its function on the server's proxy, made by the host.
    pub alias: String,
    /// The server's description of the tool; `None` when it gave none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The tool's JSON Schema of its arguments, as the server gave it.
    pub input_schema: Value,
    /// The JSON Schema of its structured result, when the server declares one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// `"ask"` or `"deny"` when the user's policy asks before a call or refuses it; left out
    /// when calls are allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// With `[policy.flows]` on, the tool's flow labels and guarded arguments:
    /// `{"labels": ["acting"], "guarded": ["recipient"] | "all"}`; left out for a tool with
    /// no label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<Value>,
    /// The input schema rendered for the model (the upstream crate's `schema::Rendering`): the
    /// runtime builds the tool function's signature and `help()` from it. Shared with the
    /// catalog, which makes it once per tool list: a call that loads servers does not copy it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendering: Option<std::sync::Arc<Value>>,
}

/// A server the bridge knows of, loaded or not: what discovery shows without any schema.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DiscoveredServer {
    /// The server's name as configured.
    pub name: String,
    /// The Python identifier the runtime would bind it as, made by the host.
    pub alias: String,
    /// The configured description; `None` when none is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Host -> sandbox: one line of the channel (docs/protocol.md, "Host -> sandbox").
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostFrame<'a> {
    /// The first line a sandbox reads: the runtime's modules, the one to start, and the
    /// constants it works with. The loader reads it and hands over to the runtime.
    Boot {
        /// The runtime's modules by name (`image/runtime/<name>.py`).
        #[serde(serialize_with = "pairs_as_map")]
        modules: &'a [(&'a str, &'a str)],
        /// The module whose `main` the loader calls.
        entry: &'a str,
        /// The host's numbers and paths the runtime needs before it starts.
        constants: RuntimeConstants<'a>,
        /// The modules' compiled code a sandbox sent (`code`), when the bridge holds it: the
        /// loader runs it instead of compiling the sources when an interpreter of its kind
        /// made it.
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<&'a RuntimeCode>,
    },
    /// Run `code` in the session's namespace; answered by `output`, `display` and `rpc` frames
    /// of this id and, last, its `result`.
    Exec {
        /// The exec's id, which every frame answering it carries.
        id: u64,
        /// The Python source to run.
        code: &'a str,
        /// `None` (left out): the same as the previous exec's of this session.
        #[serde(skip_serializing_if = "Option::is_none")]
        servers: Option<&'a [LoadedServer]>,
        /// `None` (left out): the same as the previous exec's of this session.
        #[serde(skip_serializing_if = "Option::is_none")]
        discovered: Option<&'a [DiscoveredServer]>,
        /// Bytes of stdout and stderr together the runtime forwards, at most; the rest is cut
        /// as docs/protocol.md says and counted in the result's `truncated`.
        output_cap: usize,
        /// Saved skills exist: the interpreter defines them at its first exec that says so.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        skills: bool,
    },
    /// The answer to the sandbox's `rpc` frame of the same id.
    RpcResult {
        /// The id of the `rpc` frame answered.
        id: u64,
        /// Whether the method succeeded: `result` is set when it did, `error` when not.
        ok: bool,
        /// The method's result.
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        /// Why the method failed, a message for the model.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// With `error`: what kind of failure, when the runtime raises a class of its own.
        #[serde(skip_serializing_if = "Option::is_none")]
        kind: Option<&'static str>,
    },
    /// Raise `KeyboardInterrupt` in exec `id`'s code (or end it unrun when it is queued).
    Interrupt {
        /// The exec to interrupt; an id that names no running or queued exec is ignored.
        id: u64,
    },
    /// Write `data` (base64, so that the line is 4/3 of the part whatever its characters; JSON
    /// escapes would make a control character six bytes) to `path` under `/workspace/out` (a
    /// part of exec `id`'s output that was too long for its result, kept whole for the next
    /// call's code to read). Sent after the exec's result, before the next exec; answered by a
    /// `kept` frame.
    Keep {
        /// The exec whose output the part is.
        id: u64,
        /// Where to write it, relative to `/workspace/out`: `.outputs/<name>`.
        path: &'a str,
        /// The part's bytes, in base64.
        data: String,
    },
    /// Send `/workspace/out` as a tar in `tar` frames (under gVisor, where the engine cannot
    /// read the container's tmpfs): at most `limit` bytes of tar, for at most `timeout` seconds.
    /// Sent after exec `id`'s result, before the next exec.
    Files {
        /// The exec whose files these are; the `tar` frames carry it.
        id: u64,
        /// Bytes of tar at most.
        limit: u64,
        /// Seconds the runtime may take at most.
        timeout: u64,
    },
    /// Write the session's state as a snapshot, in `snap` frames of this id, at most `limit`
    /// bytes (docs/protocol.md, "Snapshots"). Sent between execs only.
    Snapshot {
        /// The snapshot's id; its `snap` frames carry it.
        id: u64,
        /// Bytes of snapshot at most (`snapshot_max_size`).
        limit: u64,
    },
    /// A snapshot of `size` bytes follows in `restore_data` frames: restore it. Sent to a fresh
    /// sandbox of the snapshot's own session, before its first exec; answered by `restored`.
    Restore {
        /// The restore's id; its `restore_data` frames and the `restored` answer carry it.
        id: u64,
        /// Bytes of snapshot that follow, exactly.
        size: u64,
    },
    /// The next bytes (base64) of the snapshot a `restore` frame announced; `end` on the last.
    RestoreData {
        /// The id of the `restore` frame these bytes belong to.
        id: u64,
        /// At most 1 MiB of the snapshot, decoded; left out on the last frame.
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        /// This is the last frame of the restore.
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
    /// What the code wrote to fd 1 (`print`, `sys.stdout`, subprocesses).
    Stdout,
    /// What the code wrote to fd 2 (`sys.stderr`, warnings, subprocesses).
    Stderr,
}

/// The error of a failed exec, as the runtime reports it (user frames only).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExecError {
    /// The exception's class name (`ValueError`, `KeyboardInterrupt`).
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The exception's message (`str(e)`).
    #[serde(default)]
    pub message: String,
    /// The formatted traceback, with the runtime's own frames removed.
    #[serde(default)]
    pub traceback: String,
}

/// How an exec ended, as the runtime reports it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ExecStatus {
    /// The code ran to its end.
    Ok,
    /// The code raised an exception (`SystemExit` included); the result's `error` says which.
    Error,
    /// An `interrupt` frame stopped it, or ended it before it ran.
    Interrupted,
}

/// The kernel a sandbox runs on, as its runtime read it at boot (`ready`): `uname`'s release
/// and version, and the first line of `/proc/version`. Under `isolation = "gvisor"` the host
/// refuses a sandbox whose kernel is not gVisor's (`sandbox::kernel`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct KernelSeen {
    /// `uname -r` (`os.uname().release`), e.g. `4.4.0` under gVisor.
    #[serde(default)]
    pub release: String,
    /// `uname -v` (`os.uname().version`), e.g. `#1 SMP Sun Jan 10 15:06:54 PST 2016`.
    #[serde(default)]
    pub version: String,
    /// The first line of `/proc/version`.
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
    /// The runtime is up and takes frames; sent once, before any code of the user's runs (a
    /// later one is forged and dropped).
    Ready {
        /// The interpreter's version (`platform.python_version()`).
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
    /// Output of exec `id`, streamed in order per stream.
    Output {
        /// The exec that wrote it.
        id: u64,
        /// Which stream it was written to.
        stream: Stream,
        /// The text written (at most 256 KiB a frame).
        data: String,
    },
    /// A rich value the code showed with `display()`.
    Display {
        /// The exec that showed it.
        id: u64,
        /// Its media type: `image/png`, `image/jpeg`, `image/gif`, `image/webp` or
        /// `text/plain`.
        mime: String,
        /// The image in base64, or the text as it is.
        data: String,
    },
    /// A request to the host (docs/protocol.md, "RPC methods"), answered by an `rpc_result`.
    Rpc {
        /// The request's id, unique in the session; the answer carries it.
        id: u64,
        /// The exec it is sent under (a thread of an earlier exec sends the current one's).
        exec: u64,
        /// The method asked for: `call_tool`, `list_servers`, `install`, ...
        method: String,
        /// The method's parameters, an object; `null` when left out.
        #[serde(default)]
        params: Value,
    },
    /// Exec `id` ended: always its last frame.
    Result {
        /// The exec that ended.
        id: u64,
        /// How it ended.
        status: ExecStatus,
        /// The repr of the code's last expression (at most ~10 KB); `None` when the last
        /// statement is not an expression or is `None`.
        #[serde(default)]
        value: Option<String>,
        /// The exception, when the status is `error` or `interrupted`.
        #[serde(default)]
        error: Option<ExecError>,
        /// Bytes of output the output cap dropped; `None` when none were.
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
        /// The exec whose `keep` frame this answers.
        id: u64,
        /// Why the file could not be written; `None` when it was.
        #[serde(default)]
        error: Option<String>,
        /// The digest of `/workspace/out` after the write.
        #[serde(default)]
        out: Option<String>,
    },
    /// One piece of the tar of `/workspace/out` that a `files` frame asked for: `data` is the
    /// next bytes (base64), `end` marks the last frame, `error` why the runtime stopped early.
    /// The host judges the tar exactly as the engine's archive (`sandbox::files::extract`).
    Tar {
        /// The exec whose `files` frame this answers.
        id: u64,
        /// The next bytes of the tar (at most 1 MiB), in base64; `None` on the last frame.
        #[serde(default)]
        data: Option<String>,
        /// This is the last frame of the tar.
        #[serde(default)]
        end: bool,
        /// With `end`: why the runtime stopped before the whole directory was sent.
        #[serde(default)]
        error: Option<String>,
    },
    /// One piece of a snapshot (`snapshot` frame, or `runtime.fork()` during exec `id`): `data`
    /// is the next bytes (base64); the last frame has `end`, what the runtime says of the
    /// snapshot (`info`: names kept and lost, sizes) and, when it wrote none, `error`.
    Snap {
        /// The `snapshot` frame's id, or the exec's for `runtime.fork()`.
        id: u64,
        /// The next bytes of the snapshot (at most 1 MiB), in base64; `None` on the last
        /// frame.
        #[serde(default)]
        data: Option<String>,
        /// This is the last frame of the snapshot.
        #[serde(default)]
        end: bool,
        /// With `end`: why no snapshot was written (the state is over the limit).
        #[serde(default)]
        error: Option<String>,
        /// With `end`: what the snapshot holds and left out (docs/protocol.md, "Snapshots":
        /// `names`, `modules`, `lost`, `cells`, `size`, `largest`, `pickler`).
        #[serde(default)]
        info: Option<Value>,
    },
    /// The answer to a restore: the names restored and those lost, or why none were.
    Restored {
        /// The `restore` frame's id.
        id: u64,
        /// The names bound again (at most 200).
        #[serde(default)]
        names: Vec<Value>,
        /// Names restored past the ones listed.
        #[serde(default)]
        more_names: u64,
        /// The names that could not be restored, each `{name, type, why}`.
        #[serde(default)]
        lost: Vec<Value>,
        /// The modules that did not import again.
        #[serde(default)]
        modules: Vec<Value>,
        /// Why the snapshot could not be read at all; the namespace is then a fresh one.
        #[serde(default)]
        error: Option<String>,
    },
    /// The runtime's own diagnostics (a frame it ignored, an interrupt it had to signal again).
    /// The sandbox can send any number of these: the host logs them at debug level only,
    /// shortened, so they cost nothing at the default level.
    Log {
        /// The runtime's level for it (`warning`, ...); logged at debug whatever it says.
        #[serde(default)]
        level: String,
        /// What the runtime says.
        #[serde(default)]
        message: String,
    },
    /// A frame of a type this host does not know: logged and dropped by the caller.
    #[serde(other)]
    Unknown,
}

/// Why a line from the sandbox was not a frame.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FrameError {
    /// The line is longer than [`MAX_FRAME_BYTES`] (its length in bytes); it was not parsed.
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge(usize),
    /// The line is not a JSON object of a frame's shape (not JSON, not an object, a known
    /// type with a field missing or of the wrong type); the parser's message.
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
    /// A splitter that keeps lines of at most `max` bytes (without the newline) and discards
    /// longer ones whole.
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
