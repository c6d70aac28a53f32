//! `run_python`'s arguments come from the MCP client: parsing and clamping them must never
//! panic (a `timeout` of 1e300 once did, and the call was never answered).
#![no_main]

use libfuzzer_sys::fuzz_target;
use bridge_core::config::Config;
use bridge_server::RunArgs;

fuzz_target!(|data: &[u8]| {
    let Ok(serde_json::Value::Object(args)) = serde_json::from_slice(data) else {
        return;
    };
    if let Ok(a) = RunArgs::parse(Some(args)) {
        let c = Config::default();
        let t = c.clamp_timeout(a.timeout);
        assert!(t <= c.max_timeout.0);
        assert!(std::time::Instant::now().checked_add(t).is_some());
    }
});
