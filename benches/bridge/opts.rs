//! Options: repetition counts and the sections asked for.

/// Repetition counts; quick mode keeps every section but runs each a few times.
pub(crate) struct Opts {
    pub(crate) quick: bool,
    pub(crate) only: Option<Vec<String>>,
    /// Spawns per configuration for start-up and tokens.
    pub(crate) startup: usize,
    /// Cold bridges (process start to first run_python).
    pub(crate) cold: usize,
    /// New sessions in a running bridge.
    pub(crate) new_session: usize,
    pub(crate) warm: usize,
    pub(crate) big_output: usize,
    pub(crate) pandas: usize,
    /// Proxy loops of `proxy_calls` calls each.
    pub(crate) proxy_runs: usize,
    pub(crate) proxy_calls: usize,
    pub(crate) warm_rss: usize,
    pub(crate) image_load: usize,
    pub(crate) load_runs: usize,
    pub(crate) load_sessions: usize,
    pub(crate) load_calls: usize,
    /// Cold/warm bridge pairs per server count in the catalog rows.
    pub(crate) catalog_runs: usize,
    /// Fresh bridges per configuration for the first call after `initialize`.
    pub(crate) pool_fresh: usize,
    /// New sessions per configuration (section 8).
    pub(crate) pool_sessions: usize,
    /// Sandboxes measured per state in section 11 (sessions, pooled ones).
    pub(crate) capacity_sandboxes: usize,
    /// Seconds each load run of section 11 lasts.
    pub(crate) capacity_secs: usize,
    /// Seconds the pooled sandboxes sit idle while their CPU is measured (section 11).
    pub(crate) idle_secs: usize,
    /// Section 11 measures its sandboxes under gVisor too (`BENCH_CAPACITY_GVISOR=1`; needs the
    /// engine's runtime `runsc`, as `isolation = "gvisor"` does).
    pub(crate) capacity_gvisor: bool,
}

impl Opts {
    pub(crate) fn from_env() -> Opts {
        let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
            || std::env::args().any(|a| a == "--quick");
        let capacity_gvisor =
            std::env::var("BENCH_CAPACITY_GVISOR").is_ok_and(|v| !v.is_empty() && v != "0");
        let only = std::env::var("BENCH_ONLY")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
        if quick {
            Opts {
                quick,
                only,
                startup: 5,
                cold: 2,
                new_session: 3,
                warm: 30,
                big_output: 5,
                pandas: 2,
                proxy_runs: 2,
                proxy_calls: 200,
                warm_rss: 1,
                image_load: 1,
                load_runs: 1,
                load_sessions: 8,
                load_calls: 50,
                catalog_runs: 1,
                pool_fresh: 2,
                pool_sessions: 3,
                capacity_sandboxes: 2,
                capacity_secs: 10,
                idle_secs: 10,
                capacity_gvisor,
            }
        } else {
            Opts {
                quick,
                only,
                startup: 20,
                cold: 10,
                new_session: 20,
                warm: 200,
                big_output: 20,
                pandas: 10,
                proxy_runs: 10,
                proxy_calls: 200,
                warm_rss: 5,
                image_load: 3,
                load_runs: 3,
                load_sessions: 8,
                load_calls: 200,
                catalog_runs: 3,
                pool_fresh: 5,
                pool_sessions: 10,
                capacity_sandboxes: 6,
                capacity_secs: 60,
                idle_secs: 60,
                capacity_gvisor,
            }
        }
    }

    /// `BENCH_<NAME>=count` overrides one repetition count (for profiling runs).
    pub(crate) fn with_overrides(mut self) -> Opts {
        let get = |k: &str| {
            std::env::var(format!("BENCH_{k}"))
                .ok()?
                .parse::<usize>()
                .ok()
        };
        for (k, f) in [
            ("PROXY_RUNS", &mut self.proxy_runs),
            ("LOAD_RUNS", &mut self.load_runs),
            ("LOAD_CALLS", &mut self.load_calls),
            ("WARM", &mut self.warm),
            ("CATALOG_RUNS", &mut self.catalog_runs),
            ("CAPACITY_SANDBOXES", &mut self.capacity_sandboxes),
            ("CAPACITY_SECS", &mut self.capacity_secs),
            ("IDLE_SECS", &mut self.idle_secs),
            ("POOL_FRESH", &mut self.pool_fresh),
        ] {
            if let Some(v) = get(k) {
                *f = v;
            }
        }
        self
    }

    pub(crate) fn wants(&self, section: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|s| s == section))
    }
}
