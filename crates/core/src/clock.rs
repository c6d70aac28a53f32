//! Wall-clock seconds, the one clock the state dir's records and container names are written
//! in (parked sandboxes' expiry, the catalog's `updated_at`).

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the epoch (0 on a clock set before it).
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
