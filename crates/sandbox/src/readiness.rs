//! Whether this bridge may run sandboxes, and on what: the engine (asked once, its failure
//! shared with those that waited), the image, what the engine can enforce (`judge`), the kept
//! answer used at start and checked again later (`check_kept`), and the revocation that refuses
//! every call once the engine no longer enforces what is needed. It also makes every sandbox
//! (`start`): the boot frame, what provisions it, and the names its container gets.
//!
//! It knows no session: what must close them (a refused answer, a revocation) is said to the
//! caller, which owns them.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::OnceCell;

use bridge_core::boxed::Boxed;
use bridge_core::config::Config;
use bridge_core::protocol::{Provision, Target};

use crate::compiled::Compiled;
use crate::container::{self, Role};
use crate::engine::{self, Enforcement, Engine};
use crate::error::SandboxError;
use crate::session::{self, Session};
use crate::{files, image, pkgdir};

/// A reporter of image-load progress: bytes streamed so far.
pub type LoadProgress = Arc<dyn Fn(u64) + Send + Sync>;

/// What checks a kept answer again once [`engine::CHECK_AFTER`] has passed: the owner of the
/// sessions, which closes them when the answer no longer holds ([`Readiness::check_kept`]).
pub(crate) type Recheck = Arc<dyn Fn() -> Boxed<'static, ()> + Send + Sync>;

/// The engine, the image and what every new sandbox is made with.
pub(crate) struct Readiness {
    config: Arc<Config>,
    engine: OnceCell<Arc<Engine>>,
    /// Serializes image preparation so concurrent first calls load the archive once.
    image_ready: OnceCell<()>,
    /// Failed attempts at either, shared with those that waited for them.
    engine_failed: Failed,
    image_failed: Failed,
    /// Shows image-load progress (bytes so far); the log when unset.
    load_progress: OnceLock<LoadProgress>,
    /// Set when the engine, asked again after its kept answer was used (`engine::Kept`), can
    /// no longer enforce what this bridge needs: why, refused to every call from then on.
    revoked: OnceLock<String>,
    /// A kept answer in use that the engine has not confirmed yet ([`Readiness::check_kept`]).
    unchecked: Mutex<Option<Unchecked>>,
    recheck: Recheck,
    /// What the last sandbox to boot said of its interpreter (the image's Python and
    /// distributions), for the capabilities resource.
    seen_target: Mutex<Option<Target>>,
    /// What makes every new sandbox ready after its boot (`packages.preinstall`).
    provision: OnceLock<Arc<dyn Provision>>,
    /// The boot frame every sandbox is sent, with the runtime's compiled code once a sandbox
    /// sent it (kept in the state dir for the next bridges).
    compiled: Compiled,
    /// This bridge's mark on its containers (`container::owner_id`).
    owner: String,
    /// Numbers this bridge's containers in their names.
    serial: AtomicU64,
}

impl Readiness {
    /// Nothing asked yet; `recheck` is run when a kept answer is due to be checked again.
    pub(crate) fn new(config: Arc<Config>, recheck: Recheck) -> Readiness {
        let compiled = Compiled::new(&config.state_dir, &config.image);
        Readiness {
            config,
            engine: OnceCell::new(),
            image_ready: OnceCell::new(),
            engine_failed: Failed::default(),
            image_failed: Failed::default(),
            load_progress: OnceLock::new(),
            revoked: OnceLock::new(),
            unchecked: Mutex::new(None),
            recheck,
            seen_target: Mutex::new(None),
            provision: OnceLock::new(),
            compiled,
            owner: container::owner_id(),
            serial: AtomicU64::new(0),
        }
    }

    /// The engine, connected at first use. A failure is not cached: the next call tries again.
    pub(crate) async fn engine(&self) -> Result<Arc<Engine>, SandboxError> {
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
                    pkgdir::sweep(&config);
                })
                .await;
            });
            Ok::<_, SandboxError>(engine)
        })
        .await
    }

    /// The engine, if it is connected already.
    pub(crate) fn connected(&self) -> Option<&Arc<Engine>> {
        self.engine.get()
    }

    /// Connect, check enforceable limits and make the image present. When the engine cannot
    /// enforce what is needed, `close_all` runs before the error is returned: a sandbox adopted
    /// from the bridge before (`park`) was not checked here, and it goes, with any session it
    /// became.
    pub(crate) async fn prepare(
        &self,
        close_all: impl Future<Output = ()>,
    ) -> Result<Arc<Engine>, SandboxError> {
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
                    close_all.await;
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
    async fn enforcement(&self, engine: &Engine) -> Result<Enforcement, SandboxError> {
        let kept = engine::Kept::of(
            engine.kind,
            &engine.endpoint,
            &engine.version,
            &self.config.state_dir,
        )
        .await;
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

    /// Check the kept answer just used [`engine::CHECK_AFTER`] from now (through `recheck`), or
    /// at shutdown if that comes first ([`Unchecked`]).
    fn check_kept_later(&self, kept: engine::Kept, used: Enforcement) {
        let recheck = Arc::clone(&self.recheck);
        let timer = tokio::spawn(async move {
            tokio::time::sleep(engine::CHECK_AFTER).await;
            recheck().await;
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

    /// Ask the engine again what it can enforce, if a kept answer is in use unchecked, and keep
    /// what it says. `Some(why)` when that no longer lets the sandbox run: every call is
    /// refused from now on (`why`), and the caller closes every sandbox.
    /// `at_shutdown`: called by the shutdown, which stops the timer.
    pub(crate) async fn check_kept(&self, at_shutdown: bool) -> Option<String> {
        let Unchecked { kept, used, timer } = self.unchecked.lock().unwrap().take()?;
        if at_shutdown {
            timer.abort();
        }
        let engine = self.engine.get().cloned()?;
        let now =
            match tokio::time::timeout(CHECK_TIMEOUT, Enforcement::query(&engine.docker)).await {
                Ok(Ok(now)) => now,
                Ok(Err(e)) => {
                    tracing::warn!("asking the engine again what it can enforce failed: {e}");
                    return None;
                }
                Err(_) => {
                    tracing::warn!(
                        "the engine did not say within {}s what it can enforce, asked again",
                        CHECK_TIMEOUT.as_secs()
                    );
                    return None;
                }
            };
        if now == used {
            kept.keep(&now).await;
            tracing::debug!("the engine's answer, asked again, is the one kept");
            return None;
        }
        // Said before the new answer is kept: whoever sees it kept finds it said.
        tracing::warn!(
            kept = ?used,
            now = ?now,
            "the engine's answer changed though nothing it is computed from did"
        );
        kept.keep(&now).await;
        let e = judge(&self.config, &now).err()?;
        let why = format!(
            "{} (the engine said so when asked again; the answer an earlier bridge kept had allowed it, and the sandboxes started since were closed)",
            bridge_core::error::Hinted::message(&e)
        );
        tracing::error!("{why}");
        let _ = self.revoked.set(why.clone());
        Some(why)
    }

    /// `Err` once the engine's answer was revoked: why, for every call from then on.
    pub(crate) fn not_revoked(&self) -> Result<(), SandboxError> {
        match self.revoked.get() {
            Some(why) => Err(SandboxError::Shared(why.clone())),
            None => Ok(()),
        }
    }

    /// Whether the engine's answer was revoked (nothing is parked or kept then).
    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked.get().is_some()
    }

    /// Report image-load progress to `f` instead of the log.
    pub(crate) fn set_load_progress(&self, f: LoadProgress) {
        let _ = self.load_progress.set(f);
    }

    /// Run `p` on every new sandbox after its boot, before it serves a call.
    pub(crate) fn set_provision(&self, p: Arc<dyn Provision>) {
        let _ = self.provision.set(p);
    }

    /// What the last sandbox to boot said of its interpreter; `None` before any booted.
    pub(crate) fn seen_target(&self) -> Option<Target> {
        self.seen_target.lock().unwrap().clone()
    }

    /// `s` booted: what it said of its interpreter is the one shown from now on.
    pub(crate) fn saw(&self, s: &Session) {
        if let Some(t) = &s.interpreter.target {
            *self.seen_target.lock().unwrap() = Some(t.clone());
        }
    }

    /// This bridge's mark on its containers.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// The next number for a container's name.
    pub(crate) fn next_serial(&self) -> u64 {
        self.serial.fetch_add(1, Ordering::Relaxed)
    }

    /// Create, start and boot a sandbox on `engine` for `role`, numbered `serial`: attached on
    /// a connection of its own through `socket` when given (it may be parked), its code let in
    /// once `gate` passes.
    pub(crate) async fn start(
        &self,
        engine: &Engine,
        role: Role<'_>,
        serial: u64,
        socket: Option<&std::path::Path>,
        gate: Option<session::Gate<'_>>,
    ) -> Result<Session, SandboxError> {
        Session::start(
            engine,
            &self.config,
            &self.compiled,
            role,
            &self.owner,
            serial,
            self.provision.get(),
            socket,
            gate,
        )
        .await
    }

    /// The host's available memory and `memory_reserve`, when the first is under the second
    /// (`None` with no reserve, or where the host does not say).
    pub(crate) fn memory_short(&self) -> Option<(u64, u64)> {
        let reserve = self.config.memory_reserve.0;
        if reserve == 0 {
            return None;
        }
        let available = bridge_core::procfs::mem_available()?;
        (available < reserve).then_some((available, reserve))
    }

    /// Stop the engine's own service, if this bridge started one.
    pub(crate) async fn shutdown(&self) {
        if let Some(engine) = self.engine.get() {
            engine.shutdown().await;
        }
    }
}

/// A kept answer of the engine's in use, to be checked [`engine::CHECK_AFTER`] after it was
/// used or when the bridge shuts down, whichever comes first: a bridge gone sooner (`exec`)
/// still checks it, so that no chain of short-lived bridges uses it unchecked.
struct Unchecked {
    kept: engine::Kept,
    used: Enforcement,
    /// Waits [`engine::CHECK_AFTER`], then checks; aborted by a shutdown that checks first.
    timer: tokio::task::JoinHandle<()>,
}

/// The longest the engine gets to answer when asked again.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the sandbox may run with what the engine can enforce: `Err` when the isolation asked
/// for is missing (never excused) or limits cannot be enforced and `allow_unenforced_limits` is
/// off; `Ok` with the limits that will go unenforced because it is on.
fn judge(config: &Config, enf: &Enforcement) -> Result<Vec<String>, SandboxError> {
    enf.isolation(config)?;
    let missing = enf.missing(config);
    if !missing.is_empty() && !config.allow_unenforced_limits {
        return Err(SandboxError::Unenforceable(missing));
    }
    Ok(missing)
}

/// Failed attempts at one thing, counted, with the last one's message.
#[derive(Default)]
struct Failed {
    count: AtomicU64,
    last: std::sync::Mutex<String>,
}

/// `cell`'s value, initialized by `init` one attempt at a time. A failure is not cached (the
/// next call tries again), but a caller that waited for an attempt that failed gets that
/// failure instead of starting another: the warm-up and a first call that race would otherwise
/// pay twice, the second attempt (a podman service started again) outliving the call's answer.
async fn init_once<T, F, Fut>(
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
