//! `mcpServers` files come from many tools and many hands: discovery must read any bytes as a
//! list of servers, skipped entries and warnings, never panic. Exercised through the public
//! `discover` with the input as `servers_file`, plus the JSONC parser on its own.
#![no_main]

use std::collections::BTreeMap;
use std::io::Write;

use libfuzzer_sys::fuzz_target;
use bridge_upstream::discovery::parse_jsonc;
use bridge_upstream::{DiscoveryContext, discover};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        // Any text: a value or an error, never a panic or a blown stack.
        let _ = parse_jsonc(text);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("servers.json");
    std::fs::File::create(&file)
        .unwrap()
        .write_all(data)
        .unwrap();
    let ctx = DiscoveryContext {
        home: None,
        xdg_config_home: None,
        cwd: dir.path().to_path_buf(),
        servers_file: Some(file),
        config_servers: BTreeMap::new(),
        allow_self_server: false,
        self_exe: Some("/usr/bin/mcp-code-bridge".into()),
        ..Default::default()
    };
    let d = discover(&ctx);
    for s in &d.servers {
        assert!(!s.name.trim().is_empty());
        let set = |v: &Option<String>| v.as_deref().is_some_and(|x| !x.trim().is_empty());
        assert!(set(&s.entry.command) != set(&s.entry.url), "{s:?}");
    }
});
