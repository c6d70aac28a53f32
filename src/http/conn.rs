//! `serve`'s connections, before any request: opening one needs no token, so what they hold is
//! bounded here, not per identity. At most `http.max_connections` are open at once, one that
//! sends nothing is closed after `http.header_timeout`, and the open-files limit is raised at
//! start so the bound, not the limit, is what a flood meets.
//!
//! A connection is *pending* until its first request has arrived whole (headers read, the
//! service called). When every place is taken, a new connection takes the place of the oldest
//! pending one, which is closed: connections that never finish their headers (a slowloris)
//! cannot keep a client that sends a whole request out, however often they are reopened. Only
//! when every place is held by a connection that did send a request is the next answered 503
//! and closed at once.
//!
//! hyper closes an HTTP/1 connection whose headers do not arrive within the timeout (and an idle
//! keep-alive one); before hyper sees a connection, its HTTP/1-or-2 detection waits for the first
//! bytes without a deadline, so [`Capped`] waits for them itself.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Open files kept for everything but connections: the engine's socket, the upstream servers'
/// pipes, state and log files, the podman processes the bridge starts.
const RESERVED_FILES: u64 = 256;
/// Refusals being written at once; beyond them a connection is closed without an answer, so a
/// flood cannot hold descriptors through its refusals either.
const REFUSING: usize = 64;
/// How long a refusal may take to be written and the client's request read through (so closing
/// does not reset the connection before the client reads the answer).
const REFUSAL_TIME: Duration = Duration::from_millis(500);
/// The HTTP/2 connection preface: a connection is HTTP/2 if its first bytes are these.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Raise the soft limit of open files to the hard one (systemd's soft default, 1024, is what a
/// few hundred idle connections would take), log it, and return the soft limit in force.
pub(super) fn raise_open_files() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    let soft = limit.rlim_cur;
    // RLIM_INFINITY cannot be a soft limit of open files (the kernel's nr_open caps it).
    let target = limit.rlim_max.min(1 << 20);
    if target <= soft {
        return soft;
    }
    let raised = libc::rlimit {
        rlim_cur: target as libc::rlim_t,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        tracing::info!("raised the open-files limit from {soft} to {target} (the hard limit)");
        target
    } else {
        let e = io::Error::last_os_error();
        tracing::warn!("could not raise the open-files limit from {soft} to {target}: {e}");
        soft
    }
}

/// How often an idle HTTP/2 connection is pinged; one whose peer does not answer within
/// `http.header_timeout` is closed (HTTP/2 has no header timeout that would close it).
const H2_PING: Duration = Duration::from_secs(30);

/// hyper's own deadlines: HTTP/1 headers (and idle keep-alive connections) within `timeout`,
/// HTTP/2 pings answered within it.
pub(super) fn deadlines(
    builder: &mut hyper_util::server::conn::auto::Builder<TokioExecutor>,
    timeout: Duration,
) {
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_PING)
        .keep_alive_timeout(timeout);
}

/// `http.max_connections`, lowered to what `open_files` leaves beside [`RESERVED_FILES`].
pub(super) fn connection_cap(configured: u32, open_files: u64) -> usize {
    let room = open_files.saturating_sub(RESERVED_FILES).max(16);
    if u64::from(configured) > room {
        tracing::warn!(
            "http.max_connections is {configured} but the open-files limit ({open_files}) leaves room for {room}: serving at most {room} connections; raise the limit (systemd: LimitNOFILE=) or lower http.max_connections"
        );
        return room as usize;
    }
    configured as usize
}

/// How long a connection that took a pending one's place waits for that place to be freed.
const EVICT_WAIT: Duration = Duration::from_secs(2);

/// The pending connections (no whole request yet), oldest first, each with what closes it.
#[derive(Default)]
struct Pending {
    next: AtomicU64,
    open: Mutex<BTreeMap<u64, CancellationToken>>,
}

impl Pending {
    fn add(&self) -> (u64, CancellationToken) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.open.lock().unwrap().insert(id, token.clone());
        (id, token)
    }

    fn done(&self, id: u64) {
        self.open.lock().unwrap().remove(&id);
    }

    /// Close the oldest pending connection; `false` when there is none.
    fn evict_oldest(&self) -> bool {
        let oldest = self.open.lock().unwrap().pop_first();
        match oldest {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }
}

/// A connection's place among the pending ones, left when its first request arrives (the
/// service is called) or when it closes.
struct Mark {
    id: u64,
    pending: Arc<Pending>,
    left: AtomicBool,
}

impl Mark {
    fn leave(&self) {
        if !self.left.swap(true, Ordering::AcqRel) {
            self.pending.done(self.id);
        }
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The connection's service: its first call marks the connection as having sent a whole
/// request, so it is no longer taken for a slowloris.
#[derive(Clone)]
pub(super) struct Marked<S> {
    inner: S,
    mark: Arc<Mark>,
}

impl<S, R> tower_service::Service<R> for Marked<S>
where
    S: tower_service::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.mark.leave();
        self.inner.call(req)
    }
}

/// The acceptor of `serve` (axum-server's [`Accept`](axum_server::accept::Accept)): a
/// connection beyond the cap takes the place of the oldest pending one, or is refused when
/// none is pending; one that sends nothing within the timeout is closed.
#[derive(Clone)]
pub(super) struct Capped {
    slots: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
    pending: Arc<Pending>,
    cap: usize,
    header_timeout: Duration,
    /// Plain HTTP: a refusal can be written as an HTTP answer (under TLS it is only a close).
    plain: bool,
}

impl Capped {
    pub(super) fn new(cap: usize, header_timeout: Duration, plain: bool) -> Capped {
        Capped {
            slots: Arc::new(Semaphore::new(cap)),
            refusing: Arc::new(Semaphore::new(REFUSING)),
            pending: Arc::default(),
            cap,
            header_timeout,
            plain,
        }
    }

    async fn refuse(&self, mut stream: TcpStream) {
        let Ok(_refusing) = self.refusing.clone().try_acquire_owned() else {
            return;
        };
        tracing::info!(
            "refused a connection: {} are open, each having sent a request, the most http.max_connections allows",
            self.cap
        );
        if !self.plain {
            return;
        }
        let body = serde_json::json!({
            "error": "unavailable",
            "error_description": format!(
                "the server holds {} connections, the most http.max_connections allows; retry in a moment",
                self.cap
            ),
        })
        .to_string();
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = tokio::time::timeout(REFUSAL_TIME, async {
            // An answer before the request would be a protocol error to the client: wait for
            // its first bytes (the request's start) first.
            let mut sink = [0u8; 4096];
            let _ = tokio::time::timeout(
                REFUSAL_TIME / 2,
                tokio::io::AsyncReadExt::read(&mut stream, &mut sink),
            )
            .await;
            stream.write_all(answer.as_bytes()).await?;
            stream.shutdown().await?;
            // Read what the client sent, so the close is a FIN and not a reset that could
            // discard the answer before the client reads it.
            while tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await? > 0 {}
            io::Result::Ok(())
        })
        .await;
    }
}

/// Until the connection has sent enough to tell HTTP/1 from HTTP/2 (hyper waits for that
/// without a deadline); `false` if it closed instead.
async fn first_bytes(stream: &TcpStream) -> io::Result<bool> {
    let mut buf = [0u8; H2_PREFACE.len()];
    loop {
        stream.readable().await?;
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Ok(false);
        }
        if n == buf.len() || buf[..n] != H2_PREFACE[..n] {
            return Ok(true);
        }
        // Part of the preface: peek again once more has come.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Capped {
    /// A place under the cap: a free one, else the oldest pending connection's (closed for
    /// it); `None` when every place is held by a connection that sent a request.
    async fn place(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return Some(slot);
        }
        if !self.pending.evict_oldest() {
            return None;
        }
        tracing::info!(
            "closed the oldest connection that had not sent a whole request, for a new one: {} are open, the most http.max_connections allows",
            self.cap
        );
        tokio::time::timeout(EVICT_WAIT, self.slots.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
    }
}

impl<S: Send + 'static> axum_server::accept::Accept<TcpStream, S> for Capped {
    type Stream = Counted;
    type Service = Marked<S>;
    type Future = Pin<Box<dyn Future<Output = io::Result<(Counted, Marked<S>)>> + Send>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let Some(slot) = this.place().await else {
                this.refuse(stream).await;
                return Err(io::Error::other("over http.max_connections"));
            };
            let (id, token) = this.pending.add();
            let mark = Arc::new(Mark {
                id,
                pending: this.pending.clone(),
                left: AtomicBool::new(false),
            });
            let first = tokio::select! {
                r = tokio::time::timeout(this.header_timeout, first_bytes(&stream)) => r,
                () = token.cancelled() => return Err(evicted()),
            };
            match first {
                Ok(Ok(true)) => Ok((
                    Counted {
                        stream,
                        _slot: slot,
                        closed: Box::pin(token.cancelled_owned()),
                        _mark: mark.clone(),
                    },
                    Marked {
                        inner: service,
                        mark,
                    },
                )),
                Ok(Ok(false)) => Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "nothing sent within http.header_timeout",
                )),
            }
        })
    }
}

fn evicted() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "closed for a new connection: it had not sent a whole request while every place under http.max_connections was taken",
    )
}

/// A connection that holds its place under the cap until it is closed, or until its place is
/// taken while it is still pending (its next read fails).
pub(super) struct Counted {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    _mark: Arc<Mark>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.closed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(evicted()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_for_the_bridges_own_files() {
        assert_eq!(connection_cap(1024, 524_288), 1024);
        assert_eq!(connection_cap(1024, 1024), 768);
        assert_eq!(connection_cap(64, 100), 16);
    }
}
