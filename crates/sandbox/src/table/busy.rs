//! What the session table keeps beside its sessions: those held while their state is written
//! or restored (`Busy`), the interpreters that went without a reply that said so (`Lost`), and
//! the calls waiting for their session (`Pending`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bridge_core::identity::SessionKey;

/// The longest a start waits for room that sessions being closed or restored hold (each ends
/// within its own bound: `max_timeout` at most).
pub(crate) const BUSY_WAIT: Duration = Duration::from_secs(120);

/// Sessions out of the table while their state is written or restored (see `Table::busy`),
/// with their containers (no stray for the reaper): a call naming one waits until its holder
/// is done ([`Busy::wait`]).
#[derive(Default)]
pub(crate) struct Busy(std::sync::Mutex<HashMap<SessionKey, (BusyLock, String)>>);

/// What a call naming a [`Busy`] session waits on: locked by its holder until it is done.
type BusyLock = Arc<tokio::sync::Mutex<()>>;

/// A session held [`Busy`], until dropped.
pub(crate) struct BusyGuard<'a> {
    busy: &'a Busy,
    key: SessionKey,
    lock: Arc<tokio::sync::Mutex<()>>,
    _held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Busy {
    /// Hold `key`, whose sandbox is `container`, or `""` while its sandbox is being started
    /// (it must not be held already: every holder takes it under `starting`).
    pub(crate) fn hold(&self, key: &SessionKey, container: &str) -> BusyGuard<'_> {
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let held = Arc::clone(&lock).try_lock_owned().ok();
        self.0
            .lock()
            .unwrap()
            .insert(key.clone(), (Arc::clone(&lock), container.to_string()));
        BusyGuard {
            busy: self,
            key: key.clone(),
            lock,
            _held: held,
        }
    }

    /// Until `key` is not held.
    pub(crate) async fn wait(&self, key: &SessionKey) {
        let lock = self.0.lock().unwrap().get(key).map(|(l, _)| Arc::clone(l));
        if let Some(lock) = lock {
            drop(lock.lock().await);
        }
    }

    pub(crate) fn contains(&self, key: &SessionKey) -> bool {
        self.0.lock().unwrap().contains_key(key)
    }

    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Sessions held other than `key` (each is, or is about to be, a container).
    pub(crate) fn others(&self, key: &SessionKey) -> usize {
        self.0.lock().unwrap().keys().filter(|k| *k != key).count()
    }

    /// Sessions held whose sandbox is being started (no container known yet).
    pub(crate) fn starting(&self) -> usize {
        self.0
            .lock()
            .unwrap()
            .values()
            .filter(|(_, c)| c.is_empty())
            .count()
    }

    /// The containers of the sessions held.
    pub(crate) fn containers(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .values()
            .filter(|(_, c)| !c.is_empty())
            .map(|(_, c)| c.clone())
            .collect()
    }
}

impl BusyGuard<'_> {
    /// The held session's sandbox is `container` from now on.
    pub(crate) fn set_container(&self, container: &str) {
        if let Some((l, c)) = self.busy.0.lock().unwrap().get_mut(&self.key)
            && Arc::ptr_eq(l, &self.lock)
        {
            *c = container.to_string();
        }
    }
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        let mut m = self.busy.0.lock().unwrap();
        if m.get(&self.key)
            .is_some_and(|(l, _)| Arc::ptr_eq(l, &self.lock))
        {
            m.remove(&self.key);
        }
    }
}

/// Sessions whose interpreter went without a reply that said so (a call that reset it was
/// cancelled, its sandbox stopped between calls, it was closed to make room): the next call of
/// that name, which starts a fresh interpreter, says why. Bounded: a name seen again takes its
/// entry, and past [`Lost::MAX`] names an old entry goes.
#[derive(Default)]
pub(crate) struct Lost(std::sync::Mutex<HashMap<SessionKey, String>>);

impl Lost {
    pub(crate) const MAX: usize = 256;

    pub(crate) fn note(&self, session: &SessionKey, why: String) {
        let mut m = self.0.lock().unwrap();
        if m.len() >= Self::MAX
            && !m.contains_key(session)
            && let Some(k) = m.keys().next().cloned()
        {
            m.remove(&k);
        }
        m.insert(session.clone(), why);
    }

    /// The notice for a fresh interpreter of `session`, if its last one went unannounced.
    pub(crate) fn take(&self, session: &SessionKey) -> Option<String> {
        let why = self.0.lock().unwrap().remove(session)?;
        Some(format!(
            "session {:?} was reset since its last reply ({why}); this call runs in a fresh interpreter: variables and imports are gone.",
            session.name()
        ))
    }
}

/// One call waiting for its session, counted in `Table::pending` until dropped.
pub(crate) struct Pending<'a>(pub(crate) &'a AtomicUsize);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
