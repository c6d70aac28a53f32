//! The transport to a stdio upstream: rmcp's line transport over the child's pipes, with the
//! child's stdout watched for messages longer than rmcp accepts.
//!
//! rmcp drops such a line and carries on. The call it answered would then wait for
//! `upstream_call_timeout` and be reported as a timeout; with the watch, the pool fails the calls
//! in flight on that server at once and names the size. (The dropped line cannot be matched to
//! its request without parsing 16 MiB of JSON, so every call in flight on the server is failed;
//! calls are rarely concurrent on one server, and a server that answers one call with more than
//! 16 MiB is not one whose other answers are worth waiting for.)

use std::pin::Pin;
use std::process::Stdio;
use std::task::{Context, Poll};
use std::time::Duration;

use process_wrap::tokio::{ChildWrapper, CommandWrap};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::{AsyncRwTransport, DEFAULT_MAX_LINE_LENGTH};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::watch;

/// Longest message accepted from an upstream over stdio: rmcp's line limit, named once here.
pub const MAX_MESSAGE_BYTES: usize = DEFAULT_MAX_LINE_LENGTH;

/// How long a closed server gets to exit on its own before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// A running stdio server and the transport to it.
pub struct ChildTransport {
    child: Option<Box<dyn ChildWrapper>>,
    inner: AsyncRwTransport<RoleClient, LineWatch<ChildStdout>, ChildStdin>,
}

/// What [`spawn`] gives: the transport, the child's stderr, its pid, and a counter of messages
/// dropped for their size (it changes once per such message).
pub struct Spawned {
    /// The MCP transport over the child's stdin and stdout; it owns the child.
    pub transport: ChildTransport,
    /// The child's stderr, for the caller to forward (`None` if it could not be taken).
    pub stderr: Option<ChildStderr>,
    /// The child's pid, which is also its process group's id (`None` once it was reaped).
    pub pid: Option<u32>,
    /// Changes once for each message from the child over [`MAX_MESSAGE_BYTES`], which the
    /// transport drops: a call waiting for an answer watches it.
    pub oversize: watch::Receiver<u64>,
}

/// The variables of the bridge's own environment a stdio server inherits, unless its definition
/// says `inherit_env = true`: what a program needs to find its tools, home, locale, temporary
/// files, terminal and time zone, and to reach the network through the host's proxy and CA
/// certificates. Everything else (the bridge's `MCP_BRIDGE_*` settings, other programs' tokens)
/// stays with the bridge; a server gets what it needs beyond this through its `env`. Names ending
/// in `*` are prefixes. docs/servers.md ("Environment and secrets") lists the same.
pub const BASE_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "TZ",
    "TMPDIR",
    "XDG_*",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NIX_SSL_CERT_FILE",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
];

/// Whether `name` is one of [`BASE_ENV`].
pub fn in_base_env(name: &str) -> bool {
    BASE_ENV.iter().any(|b| match b.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *b,
    })
}

/// The command that starts a stdio server: `program args`, with [`BASE_ENV`] of the bridge's
/// environment (all of it when `inherit_env`) and then the server's declared `env` on top.
pub fn command<'a>(
    program: &str,
    args: &[String],
    env: impl IntoIterator<Item = (&'a String, &'a String)>,
    inherit_env: bool,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args);
    if !inherit_env {
        cmd.env_clear();
        cmd.envs(std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(in_base_env)));
    }
    cmd.envs(env);
    cmd
}

/// Start `cmd` with piped stdin, stdout and stderr.
pub fn spawn(mut cmd: CommandWrap) -> std::io::Result<Spawned> {
    cmd.command_mut()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let stdin = child
        .stdin()
        .take()
        .ok_or_else(|| std::io::Error::other("the child's stdin was not piped"))?;
    let stdout = child
        .stdout()
        .take()
        .ok_or_else(|| std::io::Error::other("the child's stdout was not piped"))?;
    let stderr = child.stderr().take();
    let (tx, oversize) = watch::channel(0);
    let watched = LineWatch::new(stdout, MAX_MESSAGE_BYTES, tx);
    Ok(Spawned {
        pid: child.id(),
        transport: ChildTransport {
            child: Some(child),
            inner: AsyncRwTransport::new(watched, stdin).with_max_line_length(MAX_MESSAGE_BYTES),
        },
        stderr,
        oversize,
    })
}

impl Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.inner.receive()
    }

    /// The MCP stdio shutdown: close the server's stdin, let it exit, kill it if it does not.
    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await?;
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(EXIT_GRACE, child.wait())
                .await
                .is_err()
        {
            Box::into_pin(child.kill()).await?;
        }
        Ok(())
    }
}

impl Drop for ChildTransport {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `kill_on_drop` on the command reaps it too; this makes the kill explicit and prompt.
            let _ = child.start_kill();
        }
    }
}

/// An `AsyncRead` that passes bytes through unchanged and bumps `oversize` once for each line
/// longer than `limit` bytes, its newline counted (as rmcp counts).
pub struct LineWatch<R> {
    inner: R,
    limit: usize,
    /// Bytes of the current line so far.
    line: usize,
    /// Whether the current line was already counted.
    counted: bool,
    oversize: watch::Sender<u64>,
}

impl<R> LineWatch<R> {
    /// Watch `inner`'s lines for ones over `limit` bytes, bumping `oversize` once for each.
    pub fn new(inner: R, limit: usize, oversize: watch::Sender<u64>) -> Self {
        LineWatch {
            inner,
            limit,
            line: 0,
            counted: false,
            oversize,
        }
    }

    fn scan(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        loop {
            let (segment, ended) = match rest.iter().position(|b| *b == b'\n') {
                Some(i) => (&rest[..i], Some(i)),
                None => (rest, None),
            };
            self.line += segment.len() + usize::from(ended.is_some());
            if self.line > self.limit && !self.counted {
                self.counted = true;
                self.oversize.send_modify(|n| *n += 1);
                tracing::warn!(
                    limit_mib = self.limit >> 20,
                    "an upstream server sent a message longer than the limit; it is dropped"
                );
            }
            match ended {
                Some(i) => {
                    self.line = 0;
                    self.counted = false;
                    rest = &rest[i + 1..];
                }
                None => return,
            }
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineWatch<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = poll {
            this.scan(&buf.filled()[before..]);
        }
        poll
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_environment_keeps_what_programs_need_and_nothing_of_ours() {
        for name in [
            "PATH",
            "HOME",
            "LC_ALL",
            "LC_CTYPE",
            "XDG_RUNTIME_DIR",
            "TMPDIR",
            "https_proxy",
        ] {
            assert!(in_base_env(name), "{name}");
        }
        for name in [
            "MCP_BRIDGE_LOG_LEVEL",
            "GITHUB_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "PATHX",
            "LD_PRELOAD",
        ] {
            assert!(!in_base_env(name), "{name}");
        }
    }
    use tokio::io::AsyncReadExt;

    async fn count(input: &[u8], limit: usize, chunk: usize) -> (u64, Vec<u8>) {
        let (tx, rx) = watch::channel(0);
        let mut w = LineWatch::new(input, limit, tx);
        let mut out = Vec::new();
        let mut buf = vec![0; chunk];
        loop {
            let n = w.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        (*rx.borrow(), out)
    }

    #[tokio::test]
    async fn each_line_over_the_limit_is_counted_once_whatever_the_reads() {
        let mut input = Vec::new();
        input.extend_from_slice(b"short\n");
        input.extend(std::iter::repeat_n(b'x', 100));
        input.extend_from_slice(b"\nexactly10\n");
        input.extend(std::iter::repeat_n(b'y', 11));
        input.extend_from_slice(b"\nok\n");
        input.extend(std::iter::repeat_n(b'z', 50)); // unterminated, still over
        for chunk in [1, 3, 7, 64, 4096] {
            let (n, out) = count(&input, 10, chunk).await;
            assert_eq!(n, 3, "chunk {chunk}");
            assert_eq!(out, input, "bytes pass through unchanged (chunk {chunk})");
        }
        let (n, _) = count(b"012345678\n0123456789", 10, 4).await;
        assert_eq!(
            n, 0,
            "a line of exactly the limit (newline included) is accepted, as rmcp does"
        );
        let (n, _) = count(b"0123456789\n", 10, 4).await;
        assert_eq!(n, 1, "one byte more is not");
    }
}
