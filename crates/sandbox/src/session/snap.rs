//! A session's state written out and read back (`sandbox::snapshots`): `snapshot` asks an idle
//! session's runtime for it and stores what arrives, bounded; `restore` streams a stored
//! snapshot into a fresh sandbox before its first exec; the `snap` frames of `runtime.fork()`
//! arrive during an exec and are taken by `on_fork_piece`.

use super::*;
use crate::snapshots::{Failed, Received, Receiving};

/// Raw bytes of one `restore_data` frame (base64 makes them 1 MiB).
const PIECE: usize = 768 << 10;

impl Session {
    /// Frames of this session's exec that are pieces of its `runtime.fork()`'s snapshot:
    /// received into a temporary file of the snapshots' directory, bounded by
    /// `snapshot_max_size`; the finished snapshot waits in the session for the `fork` call that
    /// follows them (`Session::take_forked`).
    pub(super) fn on_fork_piece(
        &self,
        fork: &mut Option<Receiving>,
        data: Option<String>,
        end: bool,
        error: Option<String>,
        info: Option<serde_json::Value>,
    ) {
        let Some(limit) = self.snapshot_limit.filter(|l| *l > 0) else {
            return;
        };
        if fork.is_none() {
            match Receiving::new(&self.state_dir, limit) {
                Ok(r) => *fork = Some(r),
                Err(e) => {
                    tracing::warn!(session = %bridge_core::text::visible(&self.name), "could not receive a fork's snapshot: {e}");
                    return;
                }
            }
        }
        if let Some(data) = data {
            fork.as_mut().expect("made above").push(&data);
        }
        if end {
            let r = fork.take().expect("made above");
            let done = match error {
                Some(why) => Err(Failed::Refused {
                    why: bridge_core::text::visible(&why).into_owned(),
                }),
                None => r.finish(Info::from_frame(info.as_ref())),
            };
            *self.forked.lock().unwrap() = Some(done);
        }
    }

    /// The snapshot the last `runtime.fork()` of this session sent, taken once.
    pub fn take_forked(&self) -> Option<Result<Received, Failed>> {
        self.forked.lock().unwrap().take()
    }

    /// Write this session's state as a snapshot (the session must be idle: it is closing).
    /// Bounded by `limit` bytes and `timeout`; what arrives goes to a temporary file of the
    /// snapshots' directory, kept by the caller ([`Received::keep`]).
    pub(crate) async fn snapshot(
        &self,
        limit: u64,
        timeout: Duration,
    ) -> Result<Received, SnapFailed> {
        if self.is_dead() {
            return Err(SnapFailed::new("its sandbox had stopped"));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let within = |what: &str| {
            SnapFailed::new(format!(
                "the sandbox did not {what} within {}s",
                timeout.as_secs()
            ))
        };
        let mut frames = tokio::time::timeout_at(deadline, self.frames.lock())
            .await
            .map_err(|_| within("finish its running code"))?;
        let id = self.next_exec.fetch_add(1, Ordering::Relaxed);
        self.current.store(id, Ordering::SeqCst);
        let taken = async {
            let mut receiving = Receiving::new(&self.state_dir, limit)
                .map_err(|e| SnapFailed::new(format!("the snapshot could not be written: {e}")))?;
            let line = HostFrame::Snapshot { id, limit }.to_line();
            self.writer
                .send(line)
                .await
                .map_err(|_| SnapFailed::new("its sandbox is gone"))?;
            while let Some(q) = frames.recv().await {
                match q.frame {
                    SandboxFrame::Snap {
                        id: fid,
                        data,
                        end,
                        error,
                        info,
                    } if fid == id => {
                        if let Some(d) = data {
                            receiving.push(&d);
                        }
                        if !end {
                            continue;
                        }
                        let info = Info::from_frame(info.as_ref());
                        if let Some(why) = error {
                            return Err(SnapFailed {
                                why: bridge_core::text::visible(&why).into_owned(),
                                info: Box::new(info),
                            });
                        }
                        return tokio::task::spawn_blocking(move || receiving.finish(info))
                            .await
                            .map_err(|e| SnapFailed::new(e.to_string()))?
                            .map_err(|e| SnapFailed::new(e.to_string()));
                    }
                    SandboxFrame::Rpc { id: rid, .. } => self.refuse(
                        rid,
                        super::exec::AFTER_END.into(),
                        &Arc::new(AtomicU64::new(0)),
                    ),
                    _ => {}
                }
            }
            Err(SnapFailed::new("its sandbox is gone"))
        };
        let r = tokio::time::timeout_at(deadline, taken)
            .await
            .unwrap_or_else(|_| Err(within("write the snapshot")));
        self.current.store(0, Ordering::SeqCst);
        r
    }

    /// Restore a snapshot of `size` bytes read from `file` into this fresh sandbox, before its
    /// first exec, within `timeout`. `Err` when the runtime could not read it at all (its
    /// namespace is then a fresh one) or the sandbox did not answer.
    pub(crate) async fn restore(
        &self,
        mut file: std::fs::File,
        size: u64,
        timeout: Duration,
    ) -> Result<Restored, Failed> {
        let mut frames = self.frames.lock().await;
        let id = self.next_exec.fetch_add(1, Ordering::Relaxed);
        self.current.store(id, Ordering::SeqCst);
        let restoring = async {
            self.writer
                .send(HostFrame::Restore { id, size }.to_line())
                .await
                .map_err(|_| Failed::Gone)?;
            loop {
                let (piece, f) = tokio::task::spawn_blocking(move || {
                    let p = crate::snapshots::next_piece(&mut file, PIECE);
                    (p, file)
                })
                .await
                .map_err(Failed::Task)?;
                file = f;
                let piece = piece.map_err(Failed::Read)?;
                let end = piece.is_none();
                let line = HostFrame::RestoreData {
                    id,
                    data: piece,
                    end,
                }
                .to_line();
                self.writer.send(line).await.map_err(|_| Failed::Gone)?;
                if end {
                    break;
                }
            }
            while let Some(q) = frames.recv().await {
                if let SandboxFrame::Restored {
                    id: fid,
                    names,
                    more_names,
                    lost,
                    modules,
                    error,
                } = q.frame
                    && fid == id
                {
                    if let Some(why) = error {
                        return Err(Failed::Refused {
                            why: bridge_core::text::visible(&why).into_owned(),
                        });
                    }
                    return Ok(Restored {
                        names: names.len().saturating_add(more_names as usize),
                        lost: lost
                            .iter()
                            .take(200)
                            .filter_map(crate::snapshots::lost_name)
                            .collect(),
                        modules: modules
                            .iter()
                            .take(200)
                            .filter_map(|m| m.as_str())
                            .map(|m| {
                                bridge_core::text::visible(
                                    &m[..bridge_core::text::floor_char_boundary(m, 200)],
                                )
                                .into_owned()
                            })
                            .collect(),
                    });
                }
            }
            Err(Failed::Gone)
        };
        let r = tokio::time::timeout(timeout, restoring)
            .await
            .unwrap_or_else(|_| {
                Err(Failed::Timeout {
                    secs: timeout.as_secs(),
                })
            });
        self.current.store(0, Ordering::SeqCst);
        r
    }
}
