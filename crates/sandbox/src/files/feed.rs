//! A copy of `/workspace/out` through the runtime's channel (under gVisor, whose tmpfs the
//! engine cannot read): `tar` frames fed to the same judge, within the same bytes and a bound on
//! the number of frames.

use std::io;
use std::sync::Arc;

use futures::StreamExt;

use super::judge::{Report, judge};
use super::store::{COPY_TIMEOUT, Caps, OUT_DIR, OutStore};

/// What the host asks the runtime for when it copies `/workspace/out` through the channel: at
/// most this many bytes of tar (the read limit, so an honest runtime stops where the host
/// would), for at most this many seconds (less than [`COPY_TIMEOUT`], so that its last frame
/// arrives before the host gives up).
pub fn frames_request(caps: &Caps) -> (u64, u64) {
    (caps.read_limit(), COPY_TIMEOUT.as_secs() - 5)
}

/// `tar` frames read at most in one copy: one per 64 KiB of the read limit and 1024 more (the
/// runtime sends pieces of 1 MiB), so a runtime sending tiny frames cannot keep the host busy
/// beyond its bytes.
pub fn max_tar_frames(caps: &Caps) -> u64 {
    caps.read_limit() / (64 << 10) + 1024
}

/// One `tar` frame of a copy through the runtime's channel, as [`TarFeed::feed`] takes it.
pub enum TarPiece {
    /// A piece of the tar, base64.
    Data(String),
    /// The runtime's last frame, and why it stopped early, if it says.
    End(Option<String>),
}

/// A copy of `/workspace/out` from the runtime's `tar` frames (under gVisor): the caller reads
/// the frames off the session's channel within [`COPY_TIMEOUT`] and feeds them here, while the
/// future [`tar_feed`] returns judges the tar. The runtime writes the tar's framing too, so
/// nothing is trusted beyond what the engine's archive was: the same [`judge`] and [`extract`],
/// the same read limit, and at most [`max_tar_frames`] frames. Bad base64 ends the tar there
/// (what followed is not copied); a lying runtime so only withholds or garbles its own files.
pub struct TarFeed {
    tx: Option<tokio::sync::mpsc::Sender<io::Result<io::Cursor<Vec<u8>>>>>,
    bytes: u64,
    frames: u64,
    limit: u64,
    max_frames: u64,
    notices: Vec<String>,
}

/// A [`TarFeed`] and the judging of what it is fed, which ends when the feed is finished.
pub fn tar_feed(
    store: Arc<OutStore>,
    session: String,
    caps: Caps,
) -> (TarFeed, impl Future<Output = Report> + Send + 'static) {
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<io::Cursor<Vec<u8>>>>(4);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .boxed();
    let feed = TarFeed {
        tx: Some(tx),
        bytes: 0,
        frames: 0,
        limit: caps.read_limit(),
        max_frames: max_tar_frames(&caps),
        notices: Vec::new(),
    };
    (
        feed,
        async move { judge(stream, store, &session, caps).await },
    )
}

impl TarFeed {
    /// Take one frame; false when the copy is over (its end, or a bound).
    pub(crate) async fn feed(&mut self, piece: TarPiece) -> bool {
        use base64::Engine as _;
        self.frames += 1;
        let data = match piece {
            TarPiece::End(None) => return false,
            TarPiece::End(Some(why)) => {
                let cut = bridge_core::text::floor_char_boundary(&why, 300);
                self.notices.push(format!(
                    "the sandbox stopped sending {OUT_DIR} early: {:?}",
                    &why[..cut]
                ));
                return false;
            }
            TarPiece::Data(d) => d,
        };
        if self.frames > self.max_frames {
            self.notices.push(format!(
                "the sandbox sent {OUT_DIR} in more than {} pieces; the rest was not read",
                self.max_frames
            ));
            return false;
        }
        // Judged to its end already: the rest is read and dropped, up to the runtime's end.
        let Some(sink) = &self.tx else { return true };
        let mut raw = match base64::engine::general_purpose::STANDARD.decode(data) {
            Ok(r) => r,
            Err(e) => {
                let _ = sink
                    .send(Err(io::Error::other(format!(
                        "a piece was not base64: {e}"
                    ))))
                    .await;
                self.tx = None;
                return true;
            }
        };
        let room = self.limit - self.bytes;
        let full = raw.len() as u64 >= room;
        raw.truncate(room as usize);
        self.bytes += raw.len() as u64;
        if sink.send(Ok(io::Cursor::new(raw))).await.is_err() {
            self.tx = None;
        }
        // At the read limit: the runtime stops there too.
        !full
    }

    /// The copy ended without the runtime's last frame: `why` (the time is up, the sandbox is
    /// gone).
    pub fn stop(&mut self, why: String) {
        self.notices.push(why);
    }

    /// End the tar (what was not fed is not read) and hand back the feed's notices.
    pub fn finish(mut self) -> Vec<String> {
        self.tx = None;
        std::mem::take(&mut self.notices)
    }
}
