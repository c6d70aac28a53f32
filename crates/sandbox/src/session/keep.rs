//! What of an exec's output is kept whole: the parts too long for the result (`spill`,
//! `keep`), the files of `/workspace/out` copied through the channel under gVisor
//! (`collect_through_channel`), and displayed images past the result's limits.

use super::exec::{AFTER_END, ExecRun, KEEP_TIMEOUT};
use super::*;
use crate::files;
use crate::output::NotKept;

impl Session {
    /// Keep whole, as files, the parts of `o` that `spill` says are too long for the result:
    /// on the host (for `resources/read`) and in the sandbox under `/workspace/out/.outputs/`
    /// (for the next call's code), before the next exec can start. The sandbox's answers are
    /// awaited for [`KEEP_TIMEOUT`] in all; a part it could not write is still on the host, and
    /// the result says so.
    pub(super) async fn spill(
        &self,
        frames: &mut mpsc::Receiver<Queued>,
        id: u64,
        spill: &super::super::output::Spill,
        o: &mut ExecOutcome,
    ) {
        let parts = spill.fit.over(o);
        if parts.is_empty() {
            return;
        }
        let deadline = tokio::time::Instant::now() + KEEP_TIMEOUT;
        for part in parts {
            let name = format!("{}/{id}.{}.txt", crate::files::KEPT_DIR, part.name());
            let text = part.of(o);
            let file =
                match self
                    .files
                    .put(&name, text.as_bytes(), spill.key.name(), &self.file_caps)
                {
                    Ok(f) => f,
                    Err(why) => {
                        o.notices.push(format!(
                            "the whole {} could not be kept: {why}; the result shows part of it",
                            part.name()
                        ));
                        continue;
                    }
                };
            let line = {
                use base64::Engine as _;
                HostFrame::Keep {
                    id,
                    path: &name,
                    data: base64::engine::general_purpose::STANDARD.encode(text),
                }
                .to_line()
            };
            let t = Instant::now();
            let in_sandbox = tokio::time::timeout_at(deadline, self.keep(frames, id, line))
                .await
                .unwrap_or(Err(NotKept::NoAnswer(KEEP_TIMEOUT.as_secs())));
            tracing::debug!(session = %bridge_core::text::visible(&self.name), exec = id, part = part.name(), bytes = file.size, ms = t.elapsed().as_millis() as u64, "a part kept whole");
            o.kept.push(super::super::output::Kept {
                part,
                file,
                in_sandbox,
            });
        }
    }

    /// Send one `keep` frame and wait for its answer.
    pub(super) async fn keep(
        &self,
        frames: &mut mpsc::Receiver<Queued>,
        id: u64,
        line: Vec<u8>,
    ) -> Result<(), NotKept> {
        self.writer.send(line).await.map_err(|_| NotKept::Gone)?;
        let pending = Arc::new(AtomicU64::new(0));
        while let Some(q) = frames.recv().await {
            match q.frame {
                SandboxFrame::Kept {
                    id: fid,
                    error,
                    out,
                } if fid == id => {
                    let mut stamp = self.out_stamp.lock().unwrap();
                    let out = out.filter(|s| s.len() <= OUT_STAMP_MAX);
                    // Nothing else changed since the last copy, or the directory was empty:
                    // the host already has what was written (`OutStore::put`), so the new
                    // digest needs no copy either.
                    if stamp.latest.as_deref() == Some(OUT_EMPTY)
                        || (stamp.latest.is_some() && stamp.latest == stamp.copied)
                    {
                        stamp.copied = out.clone();
                    }
                    stamp.latest = out;
                    return error.map_or(Ok(()), |e| Err(NotKept::Refused(e)));
                }
                SandboxFrame::Rpc { id: rid, .. } => self.refuse(rid, AFTER_END.into(), &pending),
                _ => {}
            }
        }
        Err(NotKept::Gone)
    }

    /// Copy `/workspace/out` through the channel (under gVisor the engine cannot read the
    /// sandbox's tmpfs): a `files` frame asks the runtime for the directory as a tar, which
    /// arrives in `tar` frames of this exec and is judged as the engine's archive is
    /// (`files::collect_from_frames`), within [`files::COPY_TIMEOUT`] from the request.
    pub(super) async fn collect_through_channel(
        &self,
        frames: &mut mpsc::Receiver<Queued>,
        id: u64,
        key: &SessionKey,
    ) -> files::Report {
        let Some(latest) = self.wanted_copy() else {
            return files::Report::default();
        };
        let out = files::OUT_DIR;
        let wait = files::COPY_TIMEOUT.as_secs();
        let deadline = tokio::time::Instant::now() + files::COPY_TIMEOUT;
        let (limit, timeout) = files::frames_request(&self.file_caps);
        let line = HostFrame::Files { id, limit, timeout }.to_line();
        if !matches!(
            tokio::time::timeout_at(deadline, self.writer.send(line)).await,
            Ok(Ok(()))
        ) {
            let report = files::Report {
                new: Vec::new(),
                notices: vec![format!(
                    "{out} was not copied out: the sandbox did not take the request"
                )],
            };
            self.copied(latest, &report);
            return report;
        }
        let pending = Arc::new(AtomicU64::new(0));
        let (mut feed, judged) = files::tar_feed(
            Arc::clone(&self.files),
            key.name().to_string(),
            self.file_caps,
        );
        let reading = async {
            let mut answered = false;
            loop {
                let q = match tokio::time::timeout_at(deadline, frames.recv()).await {
                    Err(_) if answered => {
                        feed.stop(format!(
                            "the copy of {out} took more than {wait}s and was stopped"
                        ));
                        break;
                    }
                    Err(_) => {
                        feed.stop(format!(
                            "{out} was not copied out: the sandbox did not answer within {wait}s"
                        ));
                        break;
                    }
                    Ok(None) => {
                        feed.stop(format!(
                            "{out} could not be copied out: the sandbox is gone"
                        ));
                        break;
                    }
                    Ok(Some(q)) => q,
                };
                match q.frame {
                    SandboxFrame::Tar {
                        id: fid,
                        data,
                        end,
                        error,
                    } if fid == id => {
                        answered = true;
                        let piece = if end {
                            files::TarPiece::End(error)
                        } else {
                            files::TarPiece::Data(data.unwrap_or_default())
                        };
                        if !feed.feed(piece).await {
                            break;
                        }
                    }
                    SandboxFrame::Rpc { id: rid, .. } => {
                        self.refuse(rid, AFTER_END.into(), &pending)
                    }
                    _ => {}
                }
            }
            feed.finish()
        };
        let (mut report, notices) = futures::join!(judged, reading);
        report.notices.extend(notices);
        self.copied(latest, &report);
        report
    }

    /// A displayed image past the result's image limits (`why`): kept as a file of the session
    /// on the host, a link in the result, when the caller keeps what does not fit (`spill`);
    /// else dropped, with the one notice that counts them.
    pub(super) fn image_as_file(
        &self,
        run: &mut ExecRun,
        req: &ExecRequest,
        mime: &str,
        data: &str,
        why: String,
    ) {
        use base64::Engine as _;
        let Some(spill) = &req.spill else {
            return run.drop_image(why);
        };
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(data) else {
            return run.drop_image("its data is not base64".into());
        };
        let ext = mime.strip_prefix("image/").unwrap_or("bin");
        let n = run.image_files.len() + 1;
        let name = format!("{}/{}.image-{n}.{ext}", crate::files::KEPT_DIR, run.id);
        match self
            .files
            .put(&name, &bytes, spill.key.name(), &self.file_caps)
        {
            Ok(file) => {
                run.image_files_why = why;
                run.image_files.push(file);
            }
            Err(e) => run.drop_image(format!("{why}, and it could not be kept as a file: {e}")),
        }
    }
}
