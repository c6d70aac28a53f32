//! The TOML configuration is written by people: `config::load` must turn anything into a
//! `Config` or an error that names the problem, never a panic; and what it accepts must respect
//! the ranges the rest of the bridge relies on (durations it adds to `Instant::now()`).
#![no_main]

use std::io::Write;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use bridge_core::config::{self, Overrides, Secs, Size};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        // The value parsers on their own (also reached from the environment and flags).
        if let Ok(s) = Secs::parse(text) {
            assert!(s.0 <= Duration::from_secs(1_000_000_000), "{text:?} -> {s:?}");
        }
        let _ = Size::parse(text);
    }
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(data).unwrap();
    f.flush().unwrap();
    match config::load(Some(f.path()), &Overrides::default()) {
        Ok(loaded) => {
            let c = &loaded.config;
            let now = Instant::now();
            for (key, d) in [
                ("timeout", c.timeout.0),
                ("max_timeout", c.max_timeout.0),
                ("runtime_idle_timeout", c.runtime_idle_timeout.0),
                ("upstream_call_timeout", c.upstream_call_timeout.0),
                ("upstream_idle_timeout", c.upstream_idle_timeout.0),
            ] {
                assert!(
                    now.checked_add(d).is_some() && d <= Duration::from_secs(1_000_000_000),
                    "{key} = {d:?} accepted from {:?}",
                    String::from_utf8_lossy(data)
                );
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
