//! The attach stream over a socket the bridge holds itself: the same bytes bollard's attach
//! gives, but on a connection whose file descriptor can be handed to another process
//! (`sandbox::park`), so a ready sandbox can outlive the bridge that started it.
//!
//! Why not bollard's attach for these: its connection is hidden inside hyper, and podman closes
//! a container's stdin when the attach connection that carried it ends (detach keys included,
//! measured on podman 4.3), so the only way to keep a sandbox's channel across bridges is to
//! keep that very connection open, in a process that outlives the first bridge.
//!
//! Used only for pooled sandboxes that may be parked (`park::eligible`) on an engine reached over
//! a Unix socket; every other container is attached through bollard as before.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bollard::container::LogOutput;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::{Decoder, FramedRead};

use super::channel::{AttachInput, AttachOutput};

/// How long the engine gets to answer an attach request with its response head.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(10);
/// A response head longer than this is not an engine's.
const MAX_HEAD: usize = 16 << 10;

/// Why the engine's attach connection could not be opened or was refused.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The engine's socket could not be connected to.
    #[error("connecting to {}: {source}", .socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The attach request could not be sent.
    #[error("sending the attach request: {0}")]
    Send(#[source] std::io::Error),
    /// The engine's response could not be read.
    #[error("reading the attach response: {0}")]
    Read(#[source] std::io::Error),
    /// The engine closed the connection before its response head.
    #[error("the engine closed the connection before answering")]
    Closed,
    /// The response head passed [`MAX_HEAD`] bytes.
    #[error("the engine's response head is too long")]
    HeadTooLong,
    /// The engine answered neither 101 nor 200; `line` is its status line.
    #[error("the engine refused the attach: {line}")]
    Refused { line: String },
    /// The connection's file descriptor could not be duplicated.
    #[error("duplicating the attach connection: {0}")]
    Duplicate(#[source] std::io::Error),
    /// The engine did not answer within the time given (`0`).
    #[error("the engine did not answer the attach within {0:?}")]
    Timeout(Duration),
    /// bollard's attach failed (containers not attached through [`attach`]).
    #[error("{0}")]
    Engine(#[source] bollard::errors::Error),
    /// An attach connection handed over by a keeper could not be taken up.
    #[error("{0}")]
    HandedOver(#[source] std::io::Error),
}

/// Attach to container `id`'s stdin, stdout and stderr through the engine's Unix socket
/// `socket`. Returns the two halves the channel reads and writes, and a duplicate of the
/// connection's file descriptor (the same connection) for [`super::park`].
pub(crate) async fn attach(
    socket: &Path,
    id: &str,
) -> Result<(AttachOutput, AttachInput, OwnedFd), AttachError> {
    let run = async {
        let mut stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|source| AttachError::Connect {
                socket: socket.to_path_buf(),
                source,
            })?;
        let request = format!(
            "POST /containers/{id}/attach?stream=1&stdin=1&stdout=1&stderr=1 HTTP/1.1\r\nHost: engine\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(AttachError::Send)?;
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        let end = loop {
            let n = stream.read(&mut buf).await.map_err(AttachError::Read)?;
            if n == 0 {
                return Err(AttachError::Closed);
            }
            head.extend_from_slice(&buf[..n]);
            if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if head.len() > MAX_HEAD {
                return Err(AttachError::HeadTooLong);
            }
        };
        let status = String::from_utf8_lossy(&head[..end]);
        let line = status.lines().next().unwrap_or("").to_string();
        let code = line.split_whitespace().nth(1).unwrap_or("");
        if code != "101" && code != "200" {
            return Err(AttachError::Refused { line });
        }
        let leftover = head.split_off(end);
        let dup = stream
            .as_fd()
            .try_clone_to_owned()
            .map_err(AttachError::Duplicate)?;
        let (output, input) = wrap(stream, leftover);
        Ok((output, input, dup))
    };
    tokio::time::timeout(ATTACH_TIMEOUT, run)
        .await
        .map_err(|_| AttachError::Timeout(ATTACH_TIMEOUT))?
}

/// The channel's halves over an attach connection already upgraded (handed over by a keeper).
pub(crate) fn from_fd(fd: OwnedFd) -> std::io::Result<(AttachOutput, AttachInput)> {
    let std = std::os::unix::net::UnixStream::from(fd);
    std.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(std)?;
    Ok(wrap(stream, Vec::new()))
}

/// Split `stream` (bytes already read past the response head first) into the demultiplexed
/// output and an input whose shutdown leaves the connection open. `tokio::io::split`, not
/// `into_split`: an owned write half shuts the socket's write side when dropped, which podman
/// takes for the end of the container's stdin, even while a keeper holds the connection.
fn wrap(stream: tokio::net::UnixStream, leftover: Vec<u8>) -> (AttachOutput, AttachInput) {
    let (read, write) = tokio::io::split(stream);
    let reader = AsyncReadExt::chain(std::io::Cursor::new(leftover), read);
    let output = FramedRead::new(reader, Demux::default())
        .map(|r| r.map_err(|err| bollard::errors::Error::IOError { err }));
    (Box::pin(output), Box::pin(KeepOpen(write)))
}

/// A write half whose shutdown does nothing: the connection ends when its last descriptor
/// closes (the bridge's, or a keeper's), never half-way.
struct KeepOpen<W>(W);

impl<W: AsyncWrite + Unpin> AsyncWrite for KeepOpen<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The Docker attach stream of a container without a TTY: frames of an 8-byte header (the
/// stream: 0 stdin, 1 stdout, 2 stderr; three zero bytes; the payload's length, big-endian)
/// and the payload. Payloads are passed on as they arrive, never gathered whole, so a frame's
/// declared length costs no memory.
#[derive(Default)]
struct Demux {
    /// The stream of the frame being read and the bytes of it still to come.
    current: Option<(u8, usize)>,
}

impl Decoder for Demux {
    type Item = LogOutput;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<LogOutput>, std::io::Error> {
        loop {
            match self.current {
                None => {
                    if src.len() < 8 {
                        return Ok(None);
                    }
                    let stream = src[0];
                    let len = u32::from_be_bytes([src[4], src[5], src[6], src[7]]) as usize;
                    src.advance(8);
                    if stream > 3 {
                        return Err(std::io::Error::other(format!(
                            "the attach stream names stream {stream}: not a Docker stream header"
                        )));
                    }
                    if len > 0 {
                        self.current = Some((stream, len));
                    }
                }
                Some((stream, left)) => {
                    if src.is_empty() {
                        return Ok(None);
                    }
                    let n = left.min(src.len());
                    let message: Bytes = src.split_to(n).freeze();
                    self.current = (left > n).then_some((stream, left - n));
                    return Ok(Some(match stream {
                        0 => LogOutput::StdIn { message },
                        2 => LogOutput::StdErr { message },
                        _ => LogOutput::StdOut { message },
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(stream: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![stream, 0, 0, 0];
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn decode_all(bytes: &[u8], chunk: usize) -> Vec<(u8, Vec<u8>)> {
        let mut d = Demux::default();
        let mut buf = BytesMut::new();
        let mut out: Vec<(u8, Vec<u8>)> = Vec::new();
        for c in bytes.chunks(chunk) {
            buf.extend_from_slice(c);
            while let Some(item) = d.decode(&mut buf).unwrap() {
                let (s, m) = match item {
                    LogOutput::StdIn { message } => (0, message),
                    LogOutput::StdOut { message } => (1, message),
                    LogOutput::StdErr { message } => (2, message),
                    LogOutput::Console { message } => (1, message),
                };
                match out.last_mut() {
                    Some((ls, lm)) if *ls == s => lm.extend_from_slice(&m),
                    _ => out.push((s, m.to_vec())),
                }
            }
        }
        out
    }

    #[test]
    fn frames_are_split_by_stream_whatever_the_chunks() {
        let mut bytes = frame(1, b"{\"type\":\"ready\"}\n");
        bytes.extend(frame(2, b"a warning\n"));
        bytes.extend(frame(1, b""));
        bytes.extend(frame(1, b"tail"));
        for chunk in [1, 3, 8, 9, 1000] {
            assert_eq!(
                decode_all(&bytes, chunk),
                vec![
                    (1, b"{\"type\":\"ready\"}\n".to_vec()),
                    (2, b"a warning\n".to_vec()),
                    (1, b"tail".to_vec()),
                ],
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn a_huge_declared_length_is_streamed_not_gathered() {
        let mut d = Demux::default();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        buf.extend_from_slice(b"abc");
        let Some(LogOutput::StdOut { message }) = d.decode(&mut buf).unwrap() else {
            panic!("no output")
        };
        assert_eq!(&message[..], b"abc");
        assert!(d.decode(&mut buf).unwrap().is_none());
    }

    #[test]
    fn a_header_that_is_not_dockers_ends_the_stream() {
        let mut d = Demux::default();
        let mut buf = BytesMut::from(&b"HTTP/1.1 500 oops"[..]);
        assert!(d.decode(&mut buf).is_err());
    }
}
