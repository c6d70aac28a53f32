//! One exec in a session: its code sent, its frames handled as they come (output, display,
//! RPCs, the result), the deadline and its interrupts, and the end, normal or a crash.

use super::*;
use bridge_core::trace::Within as _;

/// The refusal of a tool call made by code whose exec has ended (a thread it left running).
pub(super) const AFTER_END: &str = "this call was made after its run_python call ended; await every tool call before the code finishes";
/// How long the sandbox gets to write the parts of one exec's output kept as files.
pub(super) const KEEP_TIMEOUT: Duration = Duration::from_secs(5);

/// The state of one exec while it runs.
pub(super) struct ExecRun {
    pub(super) id: u64,
    pub(super) started: Instant,
    pub(super) out: Collector,
    pub(super) notices: Vec<String>,
    pub(super) rpc_slots: Arc<Semaphore>,
    /// RPCs queued, running, or being refused.
    pub(super) pending: Arc<AtomicU64>,
    /// Bytes of the lines of RPCs queued or running: their arguments are held until answered.
    pub(super) pending_bytes: Arc<AtomicU64>,
    pub(super) rpcs: tokio::task::JoinSet<()>,
    /// Images dropped, and why (the last reason): one notice for all of them.
    pub(super) images_dropped: (u32, String),
    /// Images past the result's limits kept as files instead (`Session::image_as_file`), and
    /// why (the last reason).
    pub(super) image_files: Vec<crate::files::OutFile>,
    pub(super) image_files_why: String,
    /// Set once an interrupt was sent: why, and when the first was sent.
    pub(super) interrupted: Option<(Outcome, tokio::time::Instant)>,
    pub(super) interrupts_sent: u32,
    /// The `snap` frames of a `runtime.fork()` of this exec, as they arrive.
    pub(super) fork: Option<crate::snapshots::Receiving>,
}

impl ExecRun {
    pub(super) fn drop_image(&mut self, why: String) {
        self.images_dropped.0 += 1;
        self.images_dropped.1 = why;
    }

    /// The one notice about dropped images, and the one about images kept as files, if any.
    pub(super) fn image_notice(&mut self) {
        let (n, why) = std::mem::take(&mut self.images_dropped);
        if n > 0 {
            self.notices.push(format!(
                "{n} image(s) from display() were not returned: {why}"
            ));
        }
        if !self.image_files.is_empty() {
            self.notices.push(format!(
                "{} image(s) from display() are files instead of images ({}): see their links",
                self.image_files.len(),
                self.image_files_why
            ));
        }
    }

    /// When the exec's timer fires next: its deadline; once interrupted, the resend time, then
    /// the end of the grace period.
    pub(super) fn wake(&self, deadline: tokio::time::Instant) -> tokio::time::Instant {
        match self.interrupted {
            Some((_, sent)) if self.interrupts_sent < 2 => sent + INTERRUPT_RESEND,
            Some((_, sent)) => sent + INTERRUPT_GRACE,
            None => deadline,
        }
    }
}

/// The `result` frame of an exec.
struct ExecEnd {
    status: ExecStatus,
    value: Option<String>,
    error: Option<ExecError>,
    truncated: Option<u64>,
    out: Option<String>,
}

impl Session {
    /// Run code once the session is free: one exec at a time, the others wait in line (the
    /// frame receiver's lock, first come first served). Never fails: every way an exec can end
    /// is an [`ExecOutcome`]. `None` when the call was cancelled before its turn: it left the
    /// line (or never sent its code), nothing ran, and the session and its state are untouched
    /// (cancelling calls queued behind a running one had reset the session).
    /// `key` is the session's (the files copied out are named by it).
    pub(crate) async fn exec(&self, req: ExecRequest, key: &SessionKey) -> Option<ExecOutcome> {
        let mut frames = tokio::select! {
            // A call cancelled in the line leaves it: the lock's future is dropped.
            biased;
            _ = req.cancel.cancelled() => return None,
            f = self.frames.lock() => f,
        };
        if req.cancel.is_cancelled() {
            return None;
        }
        let started = Instant::now();
        *self.last_used.lock().unwrap() = started;
        let id = self.next_exec.fetch_add(1, Ordering::Relaxed);
        let mut run = ExecRun {
            id,
            started,
            out: Collector::new(req.output_cap),
            notices: Vec::new(),
            rpc_slots: Arc::new(Semaphore::new(MAX_CONCURRENT_RPCS)),
            pending: Arc::new(AtomicU64::new(0)),
            pending_bytes: Arc::new(AtomicU64::new(0)),
            images_dropped: (0, String::new()),
            image_files: Vec::new(),
            image_files_why: String::new(),
            rpcs: tokio::task::JoinSet::new(),
            interrupted: None,
            interrupts_sent: 0,
            fork: None,
        };
        self.current.store(id, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + req.timeout;
        // A sandbox that stopped reading its stdin fills the pipe: this send, like every other
        // await on the sandbox, ends at the call's deadline or cancellation.
        // Biased: code the writer takes at once is sent even when a cancellation came at the
        // same moment (the exec loop interrupts it). A cancellation while the writer is full
        // sends nothing (a dropped send leaves nothing in the channel): the call never started.
        let line = self.exec_line(id, &req);
        let sent = tokio::select! {
            biased;
            r = self.writer.send(line) => r.is_ok(),
            _ = req.cancel.cancelled() => {
                self.current.store(0, Ordering::SeqCst);
                // The metadata did not reach the runtime: the next exec sends it again.
                self.catalog_sent.lock().unwrap().clear();
                return None;
            }
            _ = tokio::time::sleep_until(deadline) => false,
        };
        if sent {
            self.ran_code.store(true, Ordering::Relaxed);
        }
        // The session's start notices go to the first call that ran.
        run.notices = std::mem::take(&mut *self.start_notices.lock().unwrap());
        if !sent {
            self.current.store(0, Ordering::SeqCst);
            if !self.is_dead() {
                run.notices.push("the sandbox stopped reading its input, so the code could not be sent; its sandbox was killed. The session was reset: variables and imports are gone; the next call starts fresh.".into());
                self.destroy().await;
                let mut o = run.out.finish(Outcome::Crashed, started, run.notices);
                o.session_reset = true;
                return Some(o);
            }
            return Some(self.crashed(run.out, started, run.notices).await);
        }
        let result = loop {
            tokio::select! {
                frame = frames.recv() => {
                    let Some(q) = frame else { break None };
                    if let Some(end) = self.on_frame(&mut run, &req, q) {
                        break Some(end);
                    }
                }
                _ = tokio::time::sleep_until(run.wake(deadline)) => {
                    if let Some(killed) = self.on_wake(&mut run, &req).await {
                        return Some(killed);
                    }
                }
                _ = req.cancel.cancelled(), if run.interrupted.is_none() => {
                    self.interrupt(&mut run, Outcome::Cancelled);
                }
            }
        };
        run.rpcs.abort_all();
        if run.interrupts_sent > 0 {
            tracing::debug!(session = %bridge_core::text::visible(&self.name), exec = id, interrupts = run.interrupts_sent, "the code stopped after its interrupt");
        }
        let outcome = match result {
            Some(end) => {
                let mut o = self.finish(run, &req, end);
                if let Some(spill) = &req.spill {
                    // Still this exec's: the `kept` answers come through as its frames.
                    self.spill(&mut frames, id, spill, &mut o).await;
                }
                if self.files_through_channel {
                    // Still this exec's too: the `tar` frames come through as its frames.
                    let report = self.collect_through_channel(&mut frames, id, key).await;
                    o.files.extend(report.new);
                    o.notices.extend(report.notices);
                }
                self.current.store(0, Ordering::SeqCst);
                o
            }
            None => {
                self.current.store(0, Ordering::SeqCst);
                self.dead.store(true, Ordering::Relaxed);
                self.crashed(run.out, started, run.notices).await
            }
        };
        *self.last_used.lock().unwrap() = Instant::now();
        Some(outcome)
    }

    /// The `exec` line for `req`, leaving out the server metadata when it is the same as the
    /// last this session sent (compared as bytes), so warm calls stay small.
    fn exec_line(&self, id: u64, req: &ExecRequest) -> Vec<u8> {
        let catalog = serde_json::to_vec(&(&req.binding.servers, &req.binding.discovered))
            .expect("server metadata always serializes");
        let unchanged = *self.catalog_sent.lock().unwrap() == catalog;
        let line = HostFrame::Exec {
            id,
            code: &req.code,
            servers: (!unchanged).then_some(&req.binding.servers[..]),
            discovered: (!unchanged).then_some(&req.binding.discovered[..]),
            output_cap: req.output_cap,
            skills: req.binding.skills,
        }
        .to_line();
        tracing::debug!(
            session = %bridge_core::text::visible(&self.name),
            exec = id,
            bytes = line.len(),
            servers_sent = !unchanged,
            "exec sent"
        );
        if !unchanged {
            *self.catalog_sent.lock().unwrap() = catalog;
        }
        line
    }

    /// One frame from the sandbox during an exec; `Some` when it is the exec's result.
    fn on_frame(&self, run: &mut ExecRun, req: &ExecRequest, q: Queued) -> Option<ExecEnd> {
        let id = run.id;
        let len = q.len as u64;
        match q.frame {
            SandboxFrame::Output {
                id: fid,
                stream,
                data,
            } if fid == id => {
                if let Some(sink) = &req.on_output {
                    sink(stream, &data);
                }
                run.out.push(stream, &data);
            }
            SandboxFrame::Display {
                id: fid,
                mime,
                data,
            } if fid == id => match check_image(&mime, &data) {
                _ if mime == "text/plain" => {
                    // display() of something that is not an image: shown as text, in order.
                    run.out.push(Stream::Stdout, &data);
                    if !data.ends_with('\n') {
                        run.out.push(Stream::Stdout, "\n");
                    }
                }
                Ok(()) if run.out.images.len() >= MAX_IMAGES => self.image_as_file(
                    run,
                    req,
                    &mime,
                    &data,
                    format!("at most {MAX_IMAGES} images are returned per call"),
                ),
                Ok(())
                    if run.out.images.iter().map(|(_, d)| d.len()).sum::<usize>() + data.len()
                        > MAX_IMAGES_TOTAL =>
                {
                    self.image_as_file(
                        run,
                        req,
                        &mime,
                        &data,
                        format!(
                            "the images of one call may total {} MiB of base64",
                            MAX_IMAGES_TOTAL >> 20
                        ),
                    )
                }
                Ok(()) => run.out.images.push((mime, data)),
                Err(why) => run.drop_image(why.to_string()),
            },
            SandboxFrame::Rpc {
                id: rid,
                exec,
                method,
                params,
            } => {
                if exec != id {
                    self.refuse(rid, AFTER_END.into(), &run.pending);
                } else if run.pending.load(Ordering::Relaxed) as usize >= MAX_PENDING_RPCS {
                    self.refuse(rid, format!("too many tool calls in flight (limit {MAX_PENDING_RPCS}); await some before starting more"), &run.pending);
                } else if run.pending_bytes.load(Ordering::Relaxed) + len > MAX_PENDING_RPC_BYTES {
                    self.refuse(rid, format!("too many bytes of tool-call arguments in flight (limit {} MiB); await some calls before starting more", MAX_PENDING_RPC_BYTES >> 20), &run.pending);
                } else {
                    run.pending.fetch_add(1, Ordering::Relaxed);
                    run.pending_bytes.fetch_add(len, Ordering::Relaxed);
                    let rpc = req.binding.rpc.clone();
                    let slots = run.rpc_slots.clone();
                    let writer = self.writer.clone();
                    let pending = run.pending.clone();
                    let pending_bytes = run.pending_bytes.clone();
                    // In the call's trace: the proxied call's span is a child of the call's.
                    run.rpcs.spawn(
                        async move {
                            let _permit = slots.acquire_owned().await;
                            let answer = rpc.handle(&method, params).await;
                            pending_bytes.fetch_sub(len, Ordering::Relaxed);
                            let _ = writer.send(rpc_line(rid, answer)).await;
                            pending.fetch_sub(1, Ordering::Relaxed);
                        }
                        .in_current(),
                    );
                }
            }
            SandboxFrame::Snap {
                id: fid,
                data,
                end,
                error,
                info,
            } if fid == id => self.on_fork_piece(&mut run.fork, data, end, error, info),
            SandboxFrame::Result {
                id: fid,
                status,
                value,
                error,
                truncated,
                out,
            } if fid == id => {
                return Some(ExecEnd {
                    status,
                    value,
                    error,
                    truncated,
                    out,
                });
            }
            // The reader lets through only this exec's frames; a log frame never reaches here.
            _ => {}
        }
        None
    }

    /// Send the exec an interrupt (the first, or the second when the first went unanswered).
    fn interrupt(&self, run: &mut ExecRun, why: Outcome) {
        self.send_detached(HostFrame::Interrupt { id: run.id }.to_line());
        run.interrupts_sent += 1;
        if run.interrupted.is_none() {
            run.interrupted = Some((why, tokio::time::Instant::now()));
        }
    }

    /// The exec's timer fired: the deadline (interrupt), the resend time (interrupt again), or
    /// the end of the grace period (kill the container: `Some` outcome, the session is reset).
    async fn on_wake(&self, run: &mut ExecRun, req: &ExecRequest) -> Option<ExecOutcome> {
        match run.interrupted {
            None => self.interrupt(run, Outcome::Timeout),
            Some((why, _)) if run.interrupts_sent < 2 => {
                tracing::debug!(session = %bridge_core::text::visible(&self.name), exec = run.id, "no answer to the interrupt after {}s; sending it again", INTERRUPT_RESEND.as_secs());
                self.interrupt(run, why);
            }
            Some((why, _)) => {
                // The code ignored KeyboardInterrupt: kill the container.
                tracing::debug!(session = %bridge_core::text::visible(&self.name), exec = run.id, interrupts = run.interrupts_sent, "the code ignored its interrupts; killing the sandbox");
                self.current.store(0, Ordering::SeqCst);
                run.rpcs.abort_all();
                self.destroy().await;
                let what = match why {
                    Outcome::Cancelled => "the call was cancelled".to_string(),
                    _ => format!("the time limit of {} expired", secs(req.timeout)),
                };
                run.image_notice();
                let mut notices = std::mem::take(&mut run.notices);
                notices.push(format!(
                    "{what}, and the code did not stop within {}s of KeyboardInterrupt, so its sandbox was killed. The session was reset: variables and imports are gone; the next call starts fresh.",
                    INTERRUPT_GRACE.as_secs()
                ));
                let out = std::mem::replace(&mut run.out, Collector::new(0));
                let mut o = out.finish(why, run.started, notices);
                o.session_reset = true;
                return Some(o);
            }
        }
        None
    }

    /// The outcome of an exec that sent its result.
    fn finish(&self, mut run: ExecRun, req: &ExecRequest, end: ExecEnd) -> ExecOutcome {
        run.image_notice();
        let ExecRun {
            mut out,
            mut notices,
            interrupted,
            started,
            image_files,
            ..
        } = run;
        let ExecEnd {
            status,
            value,
            error,
            truncated,
            out: stamp,
        } = end;
        self.out_stamp.lock().unwrap().latest = stamp.filter(|s| s.len() <= OUT_STAMP_MAX);
        out.truncated += truncated.unwrap_or(0);
        out.value = value;
        let outcome = match (status, interrupted) {
            (ExecStatus::Ok, _) => Outcome::Ok,
            (ExecStatus::Error, _) => Outcome::Error,
            (ExecStatus::Interrupted, Some((why, _))) => why,
            // KeyboardInterrupt raised by the code itself.
            (ExecStatus::Interrupted, None) => Outcome::Error,
        };
        match outcome {
            Outcome::Timeout => notices.push(format!(
                "the time limit of {} expired and the code was interrupted (KeyboardInterrupt); the session and its variables are kept. Pass a larger \"timeout\" (at most {}) for longer work.",
                secs(req.timeout),
                secs(req.max_timeout)
            )),
            Outcome::Cancelled => notices.push("the call was cancelled and the code was interrupted; the session and its variables are kept.".into()),
            _ => {}
        }
        if let Some(hint) = error.as_ref().and_then(|e| limit_hint(e, self.pids_limit)) {
            notices.push(hint);
        }
        let mut o = out.finish(outcome, started, notices);
        o.bridge_named_files = image_files.len();
        o.files = image_files;
        o.error = error;
        if o.error.is_none() && outcome == Outcome::Error && status == ExecStatus::Interrupted {
            o.error = Some(ExecError {
                kind: "KeyboardInterrupt".into(),
                message: String::new(),
                traceback: String::new(),
            });
        }
        o
    }

    /// Refuse an rpc without waiting. The exec loop is the only reader of the sandbox's frames,
    /// and the engine's attach stream carries both directions: if the loop waited on a full
    /// writer while the sandbox waited on its output being read, neither would move again (a
    /// flood of rpcs did exactly that). Refusals are sent from tasks, counted with the pending
    /// calls; past twice the pending limit (a sandbox that floods without reading) they are
    /// dropped, and only that sandbox's own calls wait, until its timeout.
    pub(super) fn refuse(&self, id: u64, message: String, pending: &Arc<AtomicU64>) {
        if pending.load(Ordering::Relaxed) as usize >= 2 * MAX_PENDING_RPCS {
            tracing::debug!(session = %bridge_core::text::visible(&self.name), rpc = id, "dropping the refusal of an rpc: the sandbox floods without reading");
            return;
        }
        pending.fetch_add(1, Ordering::Relaxed);
        let pending = pending.clone();
        let writer = self.writer.clone();
        tokio::spawn(async move {
            let _ = writer.send(rpc_line(id, Err(message.into()))).await;
            pending.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// Send a frame without making the exec loop wait for the writer (see [`Self::refuse`]).
    fn send_detached(&self, line: Vec<u8>) {
        let writer = self.writer.clone();
        tokio::spawn(async move {
            let _ = writer.send(line).await;
        });
    }

    /// The container died mid-exec: find out why and say so.
    async fn crashed(
        &self,
        out: Collector,
        started: Instant,
        mut notices: Vec<String>,
    ) -> ExecOutcome {
        // The attach stream can close before the engine records the exit: wait for it briefly.
        let wait = self.docker.wait_container(
            &self.container_id,
            None::<bollard::query_parameters::WaitContainerOptions>,
        );
        let _ = tokio::time::timeout(Duration::from_secs(5), wait.into_future()).await;
        let inspect = self.docker.inspect_container(&self.container_id, None);
        let state = tokio::time::timeout(Duration::from_secs(10), inspect)
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|c| c.state);
        let oom = state.as_ref().and_then(|s| s.oom_killed).unwrap_or(false);
        let code = state.as_ref().and_then(|s| s.exit_code);
        let reason = if oom {
            format!(
                "the sandbox ran out of memory (memory limit {}) and was killed",
                self.memory_limit
            )
        } else if code == Some(137) {
            // Some engines (podman on cgroup v1) do not report OOMKilled; we did not send this
            // SIGKILL, and the kernel's OOM killer is what does.
            format!(
                "the sandbox was killed by SIGKILL, almost certainly for exceeding its memory limit of {}",
                self.memory_limit
            )
        } else {
            match code {
                Some(c) => format!("the sandbox process exited unexpectedly (exit code {c})"),
                None => "the connection to the sandbox broke".to_string(),
            }
        };
        let tail: Vec<String> = self.stderr_tail.lock().unwrap().iter().cloned().collect();
        if !tail.is_empty() && !oom {
            notices.push(format!("sandbox stderr: {}", tail.join(" | ")));
        }
        notices.push(format!("{reason}. The session was reset: variables and imports are gone; the next call starts a fresh sandbox."));
        self.destroy().await;
        let mut o = out.finish(Outcome::Crashed, started, notices);
        let kind = if oom || code == Some(137) {
            "MemoryLimitExceeded"
        } else {
            "SandboxCrashed"
        };
        o.error = Some(ExecError {
            kind: kind.into(),
            message: reason,
            traceback: String::new(),
        });
        o.session_reset = true;
        o
    }
}

fn secs(d: Duration) -> String {
    bridge_core::config::Secs(d).to_string()
}
