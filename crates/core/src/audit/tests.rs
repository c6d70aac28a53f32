use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::*;
use crate::config::Size;

fn config(dir: &Path, max_size: u64, keep: u32, code: CodeKept) -> Config {
    let mut c = Config {
        state_dir: dir.join("state"),
        ..Config::default()
    };
    c.audit.max_size = Size(max_size);
    c.audit.keep = keep;
    c.audit.code = code;
    c
}

fn exec(audit: &Audit, session: &str, code: &str) {
    audit.exec(Exec {
        session,
        identity: None,
        code,
        servers: &["time".to_string()],
        status: "ok",
        error_type: None,
        duration: Duration::from_millis(12),
    });
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

#[test]
fn exec_record_fields_and_private_file() {
    let t = tempfile::tempdir().unwrap();
    let audit = Audit::open(&config(t.path(), 1 << 20, 2, CodeKept::Sha256));
    exec(&audit, "s1", "print(1)");
    assert!(audit.flush(Duration::from_secs(5)));
    let path = t.path().join("state/audit.jsonl");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let dir_mode = std::fs::metadata(t.path().join("state"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dir_mode, 0o700);
    let recs = lines(&path);
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r["kind"], "exec");
    assert_eq!(r["session"], "s1");
    assert_eq!(r["status"], "ok");
    assert_eq!(r["duration_ms"], 12);
    assert_eq!(r["servers"], serde_json::json!(["time"]));
    assert_eq!(
        r["code_sha256"],
        hex::encode(Sha256::digest(b"print(1)")).as_str()
    );
    assert!(r.get("code").is_none(), "sha256 mode keeps no code: {r}");
    let ts = r["ts"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(ts).is_ok() && ts.ends_with('Z'),
        "{ts}"
    );
}

#[test]
fn full_code_is_kept_and_capped() {
    let t = tempfile::tempdir().unwrap();
    let audit = Audit::open(&config(t.path(), 1 << 20, 2, CodeKept::Full));
    exec(&audit, "s", "x = 1");
    let big = "é".repeat(MAX_CODE_KEPT); // two bytes each: cut inside a character
    exec(&audit, "s", &big);
    assert!(audit.flush(Duration::from_secs(5)));
    let recs = lines(&t.path().join("state/audit.jsonl"));
    assert_eq!(recs[0]["code"], "x = 1");
    assert!(recs[0].get("code_truncated").is_none());
    let kept = recs[1]["code"].as_str().unwrap();
    assert!(kept.len() <= MAX_CODE_KEPT && big.starts_with(kept));
    assert_eq!(recs[1]["code_truncated"], true);
    assert_eq!(recs[1]["code_sha256"], code_sha256(&big).as_str());
}

#[test]
fn tool_call_record_has_digest_not_arguments() {
    let t = tempfile::tempdir().unwrap();
    let audit = Audit::open(&config(t.path(), 1 << 20, 2, CodeKept::Sha256));
    let args = serde_json::json!({"token": "s3cr3t-value", "n": 1});
    let rec = ToolCallRecord::new(
        "default",
        "github",
        "delete_repo",
        args.as_object(),
        Decision::AskDenied,
        Some("github.delete_* (ask, /etc/mcp-code-bridge/config.toml)"),
    );
    assert_eq!(rec.status, ToolStatus::Denied);
    audit.tool_call(rec.finished(ToolStatus::Denied, Duration::from_millis(1500)));
    let ok = ToolCallRecord::new("default", "time", "now", None, Decision::Allow, None)
        .finished(ToolStatus::Ok, Duration::from_millis(3));
    audit.tool_call(ok);
    assert!(audit.flush(Duration::from_secs(5)));
    let path = t.path().join("state/audit.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("s3cr3t"), "{text}");
    let recs = lines(&path);
    let r = &recs[0];
    assert_eq!(r["kind"], "tool_call");
    assert_eq!(r["server"], "github");
    assert_eq!(r["tool"], "delete_repo");
    assert_eq!(r["decision"], "ask:denied");
    assert_eq!(r["status"], "denied");
    assert_eq!(r["duration_ms"], 1500);
    assert_eq!(
        r["arguments_sha256"],
        hex::encode(Sha256::digest(serde_json::to_vec(&args).unwrap())).as_str()
    );
    assert_eq!(recs[1]["decision"], "allow");
    assert_eq!(recs[1]["rule"], serde_json::Value::Null);
    assert_eq!(
        recs[1]["arguments_sha256"],
        hex::encode(Sha256::digest(b"{}")).as_str()
    );
}

#[test]
fn rotation_keeps_a_bounded_number_of_files() {
    let t = tempfile::tempdir().unwrap();
    let max = 2048u64;
    let audit = Audit::open(&config(t.path(), max, 3, CodeKept::Sha256));
    for i in 0..200 {
        exec(&audit, &format!("s{i}"), &format!("print({i})"));
        // Flushing each record makes every record its own batch, as calls spaced in time are.
        if i % 7 == 0 {
            assert!(audit.flush(Duration::from_secs(5)));
        }
    }
    assert!(audit.flush(Duration::from_secs(5)));
    let path = t.path().join("state/audit.jsonl");
    let files = rotated_files(&path);
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "audit.jsonl.3",
            "audit.jsonl.2",
            "audit.jsonl.1",
            "audit.jsonl"
        ]
    );
    for f in &files {
        let m = std::fs::metadata(f).unwrap();
        assert!(m.len() <= max, "{} is {} bytes", f.display(), m.len());
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
    }
    // Oldest first, in order, and the newest record is last.
    let sessions: Vec<u64> = files
        .iter()
        .flat_map(|f| lines(f))
        .map(|r| r["session"].as_str().unwrap()[1..].parse().unwrap())
        .collect();
    assert!(
        sessions.windows(2).all(|w| w[1] == w[0] + 1),
        "{sessions:?}"
    );
    assert_eq!(*sessions.last().unwrap(), 199);
    assert!(sessions[0] > 0, "the oldest records were rotated away");
}

#[test]
fn keep_zero_keeps_only_the_current_file() {
    let t = tempfile::tempdir().unwrap();
    let audit = Audit::open(&config(t.path(), 1024, 0, CodeKept::Sha256));
    for i in 0..50 {
        exec(&audit, "s", &format!("{i}"));
        assert!(audit.flush(Duration::from_secs(5)));
    }
    let path = t.path().join("state/audit.jsonl");
    assert_eq!(rotated_files(&path), vec![path.clone()]);
    assert!(std::fs::metadata(&path).unwrap().len() <= 1024);
}

#[test]
fn a_record_over_max_size_is_written_whole_in_a_file_of_its_own() {
    let t = tempfile::tempdir().unwrap();
    let audit = Audit::open(&config(t.path(), 1024, 2, CodeKept::Full));
    exec(&audit, "before", "1");
    let big = "x".repeat(5000);
    exec(&audit, "big", &big);
    exec(&audit, "after", "2");
    assert!(audit.flush(Duration::from_secs(5)));
    let path = t.path().join("state/audit.jsonl");
    let per_file: Vec<Vec<String>> = rotated_files(&path)
        .iter()
        .map(|f| {
            lines(f)
                .iter()
                .map(|r| r["session"].as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    assert_eq!(per_file, [["before"], ["big"], ["after"]]);
    let big_file = &rotated_files(&path)[1];
    assert_eq!(lines(big_file)[0]["code"].as_str().unwrap().len(), 5000);
}

#[test]
fn concurrent_writers_in_two_bridges_interleave_whole_lines() {
    let t = tempfile::tempdir().unwrap();
    let c = config(t.path(), 16 << 10, 50, CodeKept::Sha256);
    // Two `Audit`s on one file, as two bridges sharing a state directory have, each written to
    // by several threads.
    let audits = [Audit::open(&c), Audit::open(&c)];
    std::thread::scope(|s| {
        for (a, audit) in audits.iter().enumerate() {
            for th in 0..4 {
                s.spawn(move || {
                    for i in 0..250 {
                        exec(audit, &format!("a{a}t{th}"), &format!("{i}"));
                    }
                });
            }
        }
    });
    for a in &audits {
        assert!(a.flush(Duration::from_secs(10)));
        assert_eq!(a.dropped(), 0);
    }
    let path = t.path().join("state/audit.jsonl");
    let files = rotated_files(&path);
    assert!(files.len() > 2, "it rotated: {files:?}");
    let mut count = std::collections::HashMap::new();
    for f in &files {
        for r in lines(f) {
            *count
                .entry(r["session"].as_str().unwrap().to_string())
                .or_insert(0) += 1;
        }
    }
    assert_eq!(count.len(), 8);
    assert!(count.values().all(|&n| n == 250), "{count:?}");
}

#[test]
fn a_full_queue_counts_drops_and_the_next_record_says_so() {
    let t = tempfile::tempdir().unwrap();
    let max = 64u64 << 20;
    let c = config(t.path(), max, 1, CodeKept::Sha256);
    std::fs::create_dir_all(&c.state_dir).unwrap();
    let path = c.state_dir.join("audit.jsonl");
    // A file one record short of its size, and its rotation lock held here: the writer takes
    // the first record and waits on the lock, as a stalled disk would keep it.
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(max - 10).unwrap();
    let lock = std::fs::File::create(c.state_dir.join("audit.jsonl.lock")).unwrap();
    lock.lock().unwrap();
    let audit = Audit::open(&c);
    exec(&audit, "first", "0");
    let shared = audit.inner.as_ref().unwrap().shared.clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while shared.queued_bytes.load(Ordering::Acquire) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer took nothing"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let started = std::time::Instant::now();
    for i in 0..QUEUE_RECORDS + 50 {
        exec(&audit, "flood", &i.to_string());
    }
    let took = started.elapsed();
    assert_eq!(audit.dropped(), 50, "exactly what the queue could not hold");
    assert!(
        took < Duration::from_secs(2),
        "a stalled writer does not stall the callers: {took:?}"
    );
    drop(lock);
    // The queue is still full until the writer drains it: a record sent now could be dropped.
    assert!(audit.flush(Duration::from_secs(10)));
    exec(&audit, "after", "1");
    assert!(audit.flush(Duration::from_secs(10)));
    let recs = lines(&path);
    let said: u64 = recs
        .iter()
        .filter_map(|r| r["dropped_before"].as_u64())
        .sum();
    assert_eq!(said, 50, "the log names every dropped record");
    assert_eq!(recs.len(), 1 + QUEUE_RECORDS + 1);
    assert_eq!(recs.last().unwrap()["session"], "after");
}

#[test]
fn off_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let mut c = config(t.path(), 1 << 20, 2, CodeKept::Sha256);
    c.audit.path = Some("off".into());
    let audit = Audit::open(&c);
    assert!(!audit.is_on());
    exec(&audit, "s", "1");
    assert!(audit.flush(Duration::from_secs(1)));
    assert!(!t.path().join("state").exists());
}

#[test]
fn a_file_readable_by_others_is_made_private_and_a_symlink_refused() {
    let t = tempfile::tempdir().unwrap();
    let c = config(t.path(), 1 << 20, 2, CodeKept::Sha256);
    std::fs::create_dir_all(&c.state_dir).unwrap();
    let path = c.state_dir.join("audit.jsonl");
    std::fs::write(&path, "").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let audit = Audit::open(&c);
    exec(&audit, "s", "1");
    assert!(audit.flush(Duration::from_secs(5)));
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    drop(audit);

    let mut c2 = c.clone();
    let link = t.path().join("link.jsonl");
    std::os::unix::fs::symlink(t.path().join("elsewhere"), &link).unwrap();
    c2.audit.path = Some(link.display().to_string());
    let audit = Audit::open(&c2);
    exec(&audit, "s", "1");
    assert!(audit.flush(Duration::from_secs(5)));
    assert_eq!(audit.dropped(), 1);
    assert!(!t.path().join("elsewhere").exists());
}
