//! Whether this bridge may run sandboxes, and on what: the engine (asked once, its failure
//! shared with those that waited), the image, what the engine can enforce (`judge`), the kept
//! answer used at start and checked again later (`check_kept`), and `revoke`, which closes every
//! session and refuses every call once the engine no longer enforces what is needed.

use super::*;
use bridge_core::boxed::Boxed;

impl Sandbox {
    /// The engine, connected at first use. A failure is not cached: the next call tries again.
    #[inline(never)]
    pub fn engine(&self) -> Boxed<'_, Result<Arc<Engine>, SandboxError>> {
        Box::pin(self.engine_here())
    }

    async fn engine_here(&self) -> Result<Arc<Engine>, SandboxError> {
        init_once(&self.engine, &self.engine_failed, || async {
            let engine = Arc::new(Engine::connect(&self.config).await?);
            // Off the first call's path: what bridges that are gone left behind is no
            // container of this one's, and a start need not wait for its removal.
            let reaping = Arc::clone(&engine);
            let config = Arc::clone(&self.config);
            tokio::spawn(async move {
                let reaped = container::reap_orphans(&reaping).await;
                if reaped > 0 {
                    tracing::info!(reaped, "removed containers left by bridges that are gone");
                }
                let _ = tokio::task::spawn_blocking(move || {
                    files::reap_orphans(&config.state_dir);
                    crate::pkgdir::sweep(&config);
                })
                .await;
            });
            Ok::<_, SandboxError>(engine)
        })
        .await
    }

    /// Connect, check enforceable limits and make the image present.
    pub(super) async fn prepare(&self) -> Result<Arc<Engine>, SandboxError> {
        self.not_revoked()?;
        let engine = self.engine().await?;
        init_once(&self.image_ready, &self.image_failed, || async {
            let report = |bytes: u64| match self.load_progress.get() {
                Some(f) => f(bytes),
                None => tracing::info!(mib = bytes >> 20, "loading sandbox image…"),
            };
            // Independent questions to the engine, asked at once: what it can enforce, and
            // whether the image is there (loaded if not). The limits are judged first.
            let (enf, image) = tokio::join!(
                self.enforcement(&engine),
                image::ensure(&engine.docker, &self.config, &report)
            );
            let missing = match judge(&self.config, &enf?) {
                Ok(missing) => missing,
                Err(e) => {
                    // A sandbox adopted from the bridge before (`park`) was not checked here:
                    // it goes, with any session it became.
                    self.close_all().await;
                    return Err(e);
                }
            };
            if !missing.is_empty() {
                tracing::warn!(
                    "running with limits the host cannot enforce (allow_unenforced_limits): {}",
                    missing.join("; ")
                );
            }
            image.map(|_| ()).map_err(SandboxError::from)
        })
        .await?;
        Ok(engine)
    }

    /// What the engine can enforce: the answer an earlier bridge kept, when everything it is
    /// computed from is unchanged and it lets the sandbox run (asked again [`engine::CHECK_AFTER`]
    /// later, off the path), else the engine's answer now, kept for the next bridge.
    pub(super) async fn enforcement(&self, engine: &Engine) -> Result<Enforcement, SandboxError> {
        let kept = engine::Kept::of(engine, &self.config.state_dir).await;
        if let Some(kept) = &kept
            && let Some(answer) = kept.answer().await
            && judge(&self.config, &answer).is_ok()
        {
            tracing::debug!("the engine's answer kept by an earlier bridge holds");
            self.check_kept_later(kept.clone(), answer.clone());
            return Ok(answer);
        }
        let answer = Enforcement::query(&engine.docker)
            .await
            .map_err(|e| SandboxError::EngineQuery(e.to_string()))?;
        if let Some(kept) = kept {
            kept.keep(&answer).await;
        }
        Ok(answer)
    }

    /// Check the kept answer just used [`engine::CHECK_AFTER`] from now, or at shutdown if
    /// that comes first ([`Unchecked`]).
    pub(super) fn check_kept_later(&self, kept: engine::Kept, used: Enforcement) {
        let this = self.this.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(engine::CHECK_AFTER).await;
            if let Some(sb) = this.upgrade() {
                sb.check_kept(false).await;
            }
        });
        let old = self
            .unchecked
            .lock()
            .unwrap()
            .replace(Unchecked { kept, used, timer });
        if let Some(old) = old {
            old.timer.abort();
        }
    }

    /// Ask the engine again what it can enforce, if a kept answer is in use unchecked; keep
    /// what it says, and when that no longer lets the sandbox run, [`Sandbox::revoke`].
    /// `at_shutdown`: called by the shutdown, which stops the timer.
    pub(super) async fn check_kept(&self, at_shutdown: bool) {
        let Some(Unchecked { kept, used, timer }) = self.unchecked.lock().unwrap().take() else {
            return;
        };
        if at_shutdown {
            timer.abort();
        }
        let Some(engine) = self.engine.get().cloned() else {
            return;
        };
        let now =
            match tokio::time::timeout(CHECK_TIMEOUT, Enforcement::query(&engine.docker)).await {
                Ok(Ok(now)) => now,
                Ok(Err(e)) => {
                    tracing::warn!("asking the engine again what it can enforce failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::warn!(
                        "the engine did not say within {}s what it can enforce, asked again",
                        CHECK_TIMEOUT.as_secs()
                    );
                    return;
                }
            };
        kept.keep(&now).await;
        if now == used {
            tracing::debug!("the engine's answer, asked again, is the one kept");
            return;
        }
        tracing::warn!(
            kept = ?used,
            now = ?now,
            "the engine's answer changed though nothing it is computed from did"
        );
        if let Err(e) = judge(&self.config, &now) {
            self.revoke(format!(
                "{} (the engine said so when asked again; the answer an earlier bridge kept had allowed it, and the sandboxes started since were closed)",
                bridge_core::error::Hinted::message(&e)
            ))
            .await;
        }
    }

    /// Refuse every call from now on, saying `why`, and close every session and pooled sandbox.
    pub(super) async fn revoke(&self, why: String) {
        tracing::error!("{why}");
        let _ = self.revoked.set(why);
        self.close_all().await;
    }

    /// Close every session and pooled sandbox: at shutdown, or when the engine refuses what
    /// they were started under.
    pub(super) async fn close_all(&self) {
        let pooled = self.pool.drain();
        let live: Vec<Arc<Session>> = self.sessions.lock().await.drain().map(|(_, s)| s).collect();
        futures::future::join_all(
            live.iter()
                .map(|s| s.destroy())
                .chain(pooled.iter().map(|s| s.destroy())),
        )
        .await;
    }

    pub(super) fn not_revoked(&self) -> Result<(), SandboxError> {
        match self.revoked.get() {
            Some(why) => Err(SandboxError::Shared(why.clone())),
            None => Ok(()),
        }
    }
}

/// A kept answer of the engine's in use, to be checked [`engine::CHECK_AFTER`] after it was
/// used or when the bridge shuts down, whichever comes first: a bridge gone sooner (`exec`)
/// still checks it, so that no chain of short-lived bridges uses it unchecked.
pub(super) struct Unchecked {
    kept: engine::Kept,
    used: Enforcement,
    /// Waits [`engine::CHECK_AFTER`], then checks; aborted by a shutdown that checks first.
    timer: tokio::task::JoinHandle<()>,
}

/// The longest the engine gets to answer when asked again.
pub(super) const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the sandbox may run with what the engine can enforce: `Err` when the isolation asked
/// for is missing (never excused) or limits cannot be enforced and `allow_unenforced_limits` is
/// off; `Ok` with the limits that will go unenforced because it is on.
pub(super) fn judge(config: &Config, enf: &Enforcement) -> Result<Vec<String>, SandboxError> {
    enf.isolation(config)?;
    let missing = enf.missing(config);
    if !missing.is_empty() && !config.allow_unenforced_limits {
        return Err(SandboxError::Unenforceable(missing));
    }
    Ok(missing)
}

/// Failed attempts at one thing, counted, with the last one's message.
#[derive(Default)]
pub(super) struct Failed {
    count: AtomicU64,
    last: std::sync::Mutex<String>,
}

/// `cell`'s value, initialized by `init` one attempt at a time. A failure is not cached (the
/// next call tries again), but a caller that waited for an attempt that failed gets that
/// failure instead of starting another: the warm-up and a first call that race would otherwise
/// pay twice, the second attempt (a podman service started again) outliving the call's answer.
pub(super) async fn init_once<T, F, Fut>(
    cell: &OnceCell<T>,
    failed: &Failed,
    init: F,
) -> Result<T, SandboxError>
where
    T: Clone,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T, SandboxError>>,
{
    if let Some(v) = cell.get() {
        return Ok(v.clone());
    }
    let seen = failed.count.load(Ordering::SeqCst);
    cell.get_or_try_init(|| async {
        if failed.count.load(Ordering::SeqCst) != seen {
            return Err(SandboxError::Shared(failed.last.lock().unwrap().clone()));
        }
        init().await.inspect_err(|e| {
            *failed.last.lock().unwrap() = bridge_core::error::Hinted::message(e);
            failed.count.fetch_add(1, Ordering::SeqCst);
        })
    })
    .await
    .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// A caller that waited for a failing attempt gets its failure, and no second attempt runs;
    /// a caller that comes after the failure tries again, and a success is kept.
    #[tokio::test]
    async fn an_attempt_that_failed_is_shared_with_those_that_waited_not_repeated() {
        let cell: OnceCell<u32> = OnceCell::new();
        let failed = Failed::default();
        let runs = AtomicUsize::new(0);
        let attempt = |ok: bool| {
            let runs = &runs;
            move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                if ok {
                    Ok(7)
                } else {
                    Err(SandboxError::NotReady(20))
                }
            }
        };
        let (a, b) = tokio::join!(init_once(&cell, &failed, attempt(false)), async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            init_once(&cell, &failed, attempt(true)).await
        });
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the waiter started an attempt of its own"
        );
        assert!(matches!(a, Err(SandboxError::NotReady(20))));
        match b {
            Err(SandboxError::Shared(m)) => {
                assert_eq!(m, "the sandbox did not become ready within 20s")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(init_once(&cell, &failed, attempt(true)).await.unwrap(), 7);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(init_once(&cell, &failed, attempt(false)).await.unwrap(), 7);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}
