//! The pool of ready sandboxes: containers started, booted and preloaded before any call waits
//! for them, each handed to one new session and never back (a sandbox a session used is never
//! pooled again, so no state passes from one session to another).
//!
//! The pool only holds what the session table decides (`table::fill`): it refills within
//! `pool_size` and, with the sessions, within `max_sessions`; it empties after `runtime_idle_timeout` without a call
//! and at shutdown. A pooled sandbox's channel is open from its start, so whatever it writes
//! before a session takes it meets the same bounds as a session's between calls: frames of no
//! running exec are dropped at arrival, stderr reaches the log rate-limited.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::session::Session;

/// The window of new sessions the pool's size follows, and the most it remembers.
const RECENT: Duration = Duration::from_secs(120);
const RECENT_MAX: usize = 256;

/// Containers started at once (sessions' and the pool's): one per core, at least 2 and at most
/// 32. A start is the engine's and the interpreter's CPU: measured on 2 cores (BENCHMARKS.md,
/// 11d), 6 at once took 6 times as long each as one alone, and slowed the running sessions'
/// calls, for no start done sooner.
pub fn starts_at_once() -> usize {
    cores().clamp(2, 32)
}

/// The most sandboxes the pool holds while new sessions come: 4 per core, at most 16 (a pooled
/// sandbox holds what a pandas session holds, about 51 MiB: 816 MiB at most).
fn pool_most() -> usize {
    (cores() * 4).min(16)
}

fn cores() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The ready sandboxes and the starts for them (see the module's text).
pub(crate) struct Pool {
    /// Booted sandboxes, oldest first.
    ready: Mutex<VecDeque<Session>>,
    /// Sandboxes being started for the pool: they count against `max_sessions` already.
    filling: AtomicUsize,
    /// Whether a refill task runs (one at a time; it starts up to `Table::start_permits`
    /// sandboxes at once).
    refilling: AtomicBool,
    /// Calls waiting in [`Pool::take`] for a sandbox being started.
    waiting: AtomicUsize,
    /// When the latest new sessions got their sandboxes (at most [`RECENT_MAX`]): the pool
    /// holds as many as started in the last [`RECENT`].
    recent: Mutex<VecDeque<Instant>>,
    /// Set by the server (`Sandbox::warm_up`, through `Pool::enable`); one-shot uses such as `exec` keep no pool.
    enabled: AtomicBool,
    /// Set at shutdown: nothing is added any more, and what is being started is removed.
    closed: AtomicBool,
    /// The last call (or the warm-up): the pool empties and stops refilling once this is older
    /// than `runtime_idle_timeout`.
    last_call: Mutex<Instant>,
    /// Woken when a start for the pool ends, well or not.
    filled: Notify,
    /// When the start in progress began, and how long the last pooled and on-demand starts
    /// took (ms): whether waiting for the one in progress beats starting another.
    fill_began: Mutex<Option<Instant>>,
    fill_ms: AtomicU64,
    cold_ms: AtomicU64,
}

impl Pool {
    pub(crate) fn new() -> Pool {
        Pool {
            ready: Mutex::new(VecDeque::new()),
            filling: AtomicUsize::new(0),
            refilling: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            recent: Mutex::new(VecDeque::new()),
            enabled: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            last_call: Mutex::new(Instant::now()),
            filled: Notify::new(),
            fill_began: Mutex::new(None),
            fill_ms: AtomicU64::new(0),
            cold_ms: AtomicU64::new(0),
        }
    }

    /// A call came (or the bridge warmed up): the idle clock starts again.
    pub(crate) fn touch(&self) {
        *self.last_call.lock().unwrap() = Instant::now();
    }

    pub(crate) fn idle_for(&self) -> Duration {
        self.last_call.lock().unwrap().elapsed()
    }

    /// Sandboxes ready plus being started.
    pub(crate) fn held(&self) -> usize {
        self.ready.lock().unwrap().len() + self.filling.load(Ordering::SeqCst)
    }

    pub(crate) fn filling(&self) -> usize {
        self.filling.load(Ordering::SeqCst)
    }

    /// Container ids of the ready sandboxes.
    pub(crate) fn ready_ids(&self) -> Vec<String> {
        self.ready
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.container_id.clone())
            .collect()
    }

    /// Claim the right to run the refill task; false when one runs already.
    pub(crate) fn begin_refill(&self) -> bool {
        !self.refilling.swap(true, Ordering::SeqCst)
    }

    /// Whether a refill task runs (it may not have counted its start yet).
    pub(crate) fn refilling(&self) -> bool {
        self.refilling.load(Ordering::SeqCst)
    }

    pub(crate) fn end_refill(&self) {
        self.refilling.store(false, Ordering::SeqCst);
    }

    /// Count a start for the pool (done by the caller under `Table::starting`, so a session
    /// that starts meanwhile sees it).
    pub(crate) fn reserve(&self) {
        self.filling.fetch_add(1, Ordering::SeqCst);
        *self.fill_began.lock().unwrap() = Some(Instant::now());
    }

    /// A start for the pool ended: keep its sandbox if there is one, and wake waiters.
    pub(crate) fn filled(&self, s: Option<Session>) {
        if let Some(began) = self.fill_began.lock().unwrap().take()
            && s.is_some()
        {
            self.fill_ms
                .store(began.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
        if let Some(s) = s {
            self.ready.lock().unwrap().push_back(s);
        }
        self.filling.fetch_sub(1, Ordering::SeqCst);
        self.filled.notify_waiters();
    }

    /// The oldest ready sandbox that is still alive; dead ones are returned apart for removal.
    fn pop(&self) -> (Option<Session>, Vec<Session>) {
        let mut ready = self.ready.lock().unwrap();
        let mut dead = Vec::new();
        while let Some(s) = ready.pop_front() {
            if s.is_dead() {
                dead.push(s);
            } else {
                return (Some(s), dead);
            }
        }
        (None, dead)
    }

    /// Calls waiting for a sandbox being started.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// A new session gets a sandbox now (pooled or started for it).
    pub(crate) fn started_one(&self) {
        let mut recent = self.recent.lock().unwrap();
        if recent.len() >= RECENT_MAX {
            recent.pop_front();
        }
        recent.push_back(Instant::now());
    }

    /// Keep a pool from now on (the server is up).
    pub(crate) fn enable(&self) {
        self.enabled.store(true, Ordering::SeqCst);
    }

    /// Whether a pool is kept (`enable`).
    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// The bridge shuts down: nothing is added any more.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Whether the bridge shuts down (`close`).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// How many sandboxes the pool should hold: as many as new sessions took one in the last
    /// [`RECENT`], at least `pool_size` and at most [`pool_most`] (a burst of new sessions is
    /// met by ready sandboxes next time; a quiet bridge keeps `pool_size`).
    pub(crate) fn target(&self, pool_size: usize) -> usize {
        let most = pool_most();
        let mut recent = self.recent.lock().unwrap();
        while recent.front().is_some_and(|t| t.elapsed() > RECENT) {
            recent.pop_front();
        }
        recent.len().min(most).max(pool_size)
    }

    /// A ready sandbox; when none is ready but one is being started, wait for it (it started
    /// earlier than a new one would, and it counts against `max_sessions` already) at most
    /// `wait`. `None`: start one on demand.
    pub(crate) async fn take(&self, wait: Duration) -> Option<Session> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        self.take_within(wait).await
    }

    async fn take_within(&self, wait: Duration) -> Option<Session> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.filled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (got, dead) = self.pop();
            for d in dead {
                tracing::info!(container = %d.container_id, "removing a pooled sandbox that died while waiting");
                d.destroy().await;
            }
            if got.is_some() || self.filling() == 0 {
                return got;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// An on-demand start took `d`.
    pub(crate) fn cold_took(&self, d: Duration) {
        self.cold_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }

    /// Whether the start in progress is expected to end sooner than one begun now: judged by
    /// the last start of each kind (with none measured yet, it is waited for).
    pub(crate) fn worth_waiting(&self) -> bool {
        let Some(began) = *self.fill_began.lock().unwrap() else {
            return false;
        };
        let (fill, cold) = (
            self.fill_ms.load(Ordering::Relaxed),
            self.cold_ms.load(Ordering::Relaxed),
        );
        if fill == 0 || cold == 0 {
            return true;
        }
        fill.saturating_sub(began.elapsed().as_millis() as u64) <= cold
    }

    /// Take every ready sandbox out (to remove them).
    pub(crate) fn drain(&self) -> Vec<Session> {
        self.ready.lock().unwrap().drain(..).collect()
    }
}

/// One call in [`Pool::take`], counted in `Pool::waiting` until dropped (also when the call is
/// cancelled while it waits).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
