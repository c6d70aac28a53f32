//! End to end, files out: what the code writes under `/workspace/out/` comes back as
//! `resource_link` items that `resources/read` serves byte for byte, `resources/list` shows them,
//! the caps each answer with a notice, and a hostile directory loses nothing of the host, through
//! the real binary, real podman and rmcp's client.
//!
//! Parquet is not tested: the default image has no pyarrow.

use crate::common;

use base64::Engine as _;
use common::{Bridge, Home, Outcome};
use rmcp::model::{ContentBlock, ReadResourceRequestParams, ResourceContents};
use serde_json::json;
use sha2::{Digest, Sha256};

/// A valid 1x1 PNG built with the standard library, and a CSV; both written to /workspace/out,
/// their sha256 printed.
const WRITE_CSV_AND_PNG: &str = r#"
import os, struct, zlib, hashlib
os.makedirs("/workspace/out/plots", exist_ok=True)
def chunk(t, d):
    c = t + d
    return struct.pack(">I", len(d)) + c + struct.pack(">I", zlib.crc32(c) & 0xffffffff)
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) \
    + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b"")
csv = "region,sales\nnorth,10\nsouth,\u00e9t\u00e9 20\n".encode()
open("/workspace/out/sales.csv", "wb").write(csv)
open("/workspace/out/plots/trend.png", "wb").write(png)
print("csv", hashlib.sha256(csv).hexdigest())
print("png", hashlib.sha256(png).hexdigest())
display(png)
"#;

fn links(o: &Outcome) -> Vec<rmcp::model::Resource> {
    o.0.content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::ResourceLink(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn images(o: &Outcome) -> usize {
    o.0.content
        .iter()
        .filter(|c| matches!(c, ContentBlock::Image(_)))
        .count()
}

async fn read_bytes(b: &Bridge, uri: &str) -> Result<(Vec<u8>, bool), String> {
    let r = b
        .client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .map_err(|e| e.to_string())?;
    match &r.contents[0] {
        ResourceContents::TextResourceContents { text, .. } => Ok((text.as_bytes().to_vec(), true)),
        ResourceContents::BlobResourceContents { blob, .. } => Ok((
            base64::engine::general_purpose::STANDARD
                .decode(blob)
                .unwrap(),
            false,
        )),
        other => panic!("{other:?}"),
    }
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn printed_sha(o: &Outcome, what: &str) -> String {
    o.stdout()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{what} ")))
        .unwrap_or_else(|| panic!("no {what} digest in {:?}", o.stdout()))
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_csv_and_a_png_come_back_as_links_read_byte_for_byte_and_go_with_the_session() {
    let b = Bridge::start().await;
    let o = b.py(WRITE_CSV_AND_PNG).await.ok();
    let l = links(&o);
    let names: Vec<_> = l.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["plots/trend.png", "sales.csv"], "{}", o.text());
    let csv = l.iter().find(|r| r.name == "sales.csv").unwrap();
    assert_eq!(csv.mime_type.as_deref(), Some("text/csv"));
    assert_eq!(
        csv.uri,
        "resource://mcp-code-bridge/files/default/sales.csv"
    );
    let png = l.iter().find(|r| r.name == "plots/trend.png").unwrap();
    assert_eq!(png.mime_type.as_deref(), Some("image/png"));
    // The PNG was also display()ed: shown once, not twice.
    assert_eq!(images(&o), 1, "{}", o.text());
    assert!(
        o.text()
            .contains("[file] /workspace/out/sales.csv (text/csv")
    );

    let (csv_bytes, text) = read_bytes(&b, &csv.uri).await.unwrap();
    assert!(text, "a UTF-8 CSV is read as text");
    assert_eq!(sha(&csv_bytes), printed_sha(&o, "csv"));
    assert_eq!(Some(csv_bytes.len() as u64), csv.size);
    let (png_bytes, text) = read_bytes(&b, &png.uri).await.unwrap();
    assert!(!text, "a PNG is read as a blob");
    assert_eq!(sha(&png_bytes), printed_sha(&o, "png"));

    let listed = b.client.list_all_resources().await.unwrap();
    let mut uris: Vec<_> = listed.iter().map(|r| r.uri.as_str()).collect();
    uris.sort();
    assert_eq!(
        uris,
        [
            "resource://mcp-code-bridge/capabilities",
            "resource://mcp-code-bridge/files/default/plots/trend.png",
            "resource://mcp-code-bridge/files/default/sales.csv",
        ]
    );

    // A call that changes nothing brings no link; one that rewrites a file brings that one,
    // even at the same size, and an image written but not displayed is shown inline.
    let o = b.py("x = 1").await.ok();
    assert!(links(&o).is_empty(), "{}", o.text());
    let o = b
        .py("t = open('/workspace/out/sales.csv').read()\nopen('/workspace/out/sales.csv','w').write(t.replace('north','NORTH'))\nimport shutil; shutil.copy('/workspace/out/plots/trend.png', '/workspace/out/copy.png')")
        .await
        .ok();
    let names: Vec<_> = links(&o).into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["copy.png", "sales.csv"], "{}", o.text());
    assert_eq!(images(&o), 1, "the written PNG is shown inline");
    let (csv_bytes, _) = read_bytes(&b, &csv.uri).await.unwrap();
    assert!(
        String::from_utf8(csv_bytes)
            .unwrap()
            .starts_with("region,sales\nNORTH")
    );

    // Reset: the files are gone from the host, the list and the reader.
    b.call(json!({"code": "pass", "reset": true})).await;
    let err = read_bytes(&b, &csv.uri).await.unwrap_err();
    assert!(err.contains("was reset or closed"), "{err}");
    let listed = b.client.list_all_resources().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let files_dir = b.home.path().join(".local/state/mcp-code-bridge/files");
    // No directory is nothing kept; a directory that cannot be listed is no answer.
    let left: Vec<_> = match std::fs::read_dir(&files_dir) {
        Ok(d) => d.map(|e| e.unwrap().path()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("cannot list {}: {e}", files_dir.display()),
    };
    assert!(
        left.is_empty(),
        "kept files outlived their session: {left:?}"
    );
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn each_cap_is_hit_with_a_notice_naming_it() {
    let b = Bridge::start_with(
        Home::new(),
        &[
            ("MCP_BRIDGE_FILE_CAP", "4k"),
            ("MCP_BRIDGE_FILES_PER_CALL", "3"),
            ("MCP_BRIDGE_FILES_TOTAL", "10k"),
        ],
        None,
    )
    .await;
    let o = b
        .py("import os\nos.makedirs('/workspace/out', exist_ok=True)\nopen('/workspace/out/big.bin','wb').write(b'x' * 5000)\nfor i in range(5):\n    open(f'/workspace/out/f{i}.txt','w').write('a' * 100)")
        .await
        .ok();
    assert_eq!(links(&o).len(), 3, "{}", o.text());
    let t = o.text();
    assert!(
        t.contains("skipped 1 files larger than file_cap = 4k"),
        "{t}"
    );
    assert!(
        t.contains("skipped 2 files beyond files_per_call = 3"),
        "{t}"
    );
    // The rest come with the next call.
    let o = b.py("pass").await.ok();
    let names: Vec<_> = links(&o).into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["f3.txt", "f4.txt"], "{}", o.text());
    // 500 bytes are kept; three files of 3.5k would pass 10k.
    let o = b
        .py("for i in range(3):\n    open(f'/workspace/out/g{i}.bin','wb').write(b'y' * 3500)")
        .await
        .ok();
    assert_eq!(links(&o).len(), 2, "{}", o.text());
    assert!(
        o.text()
            .contains("skipped 1 files that would pass files_total = 10k for this session"),
        "{}",
        o.text()
    );
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_out_directory_loses_nothing_of_the_host_and_the_bridge_keeps_serving() {
    let b = Bridge::start().await;
    let code = r#"
import os
out = "/workspace/out"
os.makedirs(out + "/many", exist_ok=True)
os.symlink("/etc/passwd", out + "/passwd")
os.symlink("/", out + "/root")
open(out + "/real.txt", "w").write("real")
os.link(out + "/real.txt", out + "/hard.txt")
os.mkfifo(out + "/pipe")
fd = os.open(b"/workspace/out/\xff\xfe.txt", os.O_CREAT | os.O_WRONLY); os.write(fd, b"x"); os.close(fd)
open(out + "/line\nbreak.txt", "w").write("x")
for i in range(10000):
    with open(f"{out}/many/{i}", "wb") as f:
        f.write(b"t")
print("written")
"#;
    let o = b.call(json!({"code": code, "timeout": 120})).await;
    let o = Outcome(o);
    assert_eq!(o.status(), "ok", "{}", o.text());
    let t = o.text();
    eprintln!("{t}");
    let names: Vec<_> = links(&o).into_iter().map(|r| r.name).collect();
    assert!(names.len() <= 64, "{} links", names.len());
    assert!(
        !names
            .iter()
            .any(|n| n == "passwd" || n == "root" || n == "pipe"),
        "{names:?}"
    );
    assert!(t.contains("symbolic links"), "{t}");
    assert!(t.contains("fifos"), "{t}");
    assert!(t.contains("hard links"), "{t}");
    assert!(t.contains("names that are not UTF-8"), "{t}");
    assert!(t.contains("unsafe names"), "{t}");
    assert!(t.contains("files_per_call = 64"), "{t}");
    // The copy stopped at nothing outside the session's directory: only numbered files there,
    // none of them /etc/passwd.
    let files_dir = b.home.path().join(".local/state/mcp-code-bridge/files");
    let passwd = std::fs::read("/etc/passwd").unwrap();
    let mut count = 0;
    for d in std::fs::read_dir(&files_dir).unwrap() {
        for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
            let f = f.unwrap();
            let ft = f.file_type().unwrap();
            assert!(ft.is_file(), "{:?} is not a regular file", f.path());
            let name = f.file_name().to_string_lossy().into_owned();
            assert!(
                name.parse::<u64>().is_ok(),
                "{name:?} is not a number the bridge chose"
            );
            assert_ne!(std::fs::read(f.path()).unwrap(), passwd);
            count += 1;
        }
    }
    // Kept files were judged: a copy that kept none would show nothing above.
    assert!((1..=64).contains(&count), "{count} files kept");
    assert!(!b.home.path().join("etc").exists());
    // A file growing while it is copied: whatever the engine's archive says of it (larger than
    // file_cap, or cut short), the copy ends with a notice or the file, and the bridge serves on.
    let grow = r#"
import threading, time
out = "/workspace/out"
def grow():
    with open(out + "/grow.bin", "wb") as f:
        while True:
            f.write(b"g" * 65536)
            f.flush()
            if f.tell() > 64 << 20:
                f.seek(0); f.truncate()
threading.Thread(target=grow, daemon=True).start()
time.sleep(0.2)
"#;
    let o = b.call(json!({"code": grow, "timeout": 60})).await;
    let o = Outcome(o);
    assert_eq!(o.status(), "ok", "{}", o.text());
    eprintln!("{}", o.text());
    // Still serving, in the same session and another.
    let o = b.py("print(6 * 7)").await.ok();
    assert!(o.stdout().contains("42"));
    let o = Outcome(
        b.call(json!({"code": "print('other')", "session": "other"}))
            .await,
    )
    .ok();
    assert!(o.stdout().contains("other"));
    b.shutdown_clean().await;
}

/// CPU time (clock ticks) used so far by the processes of the bridge's own podman service (those
/// whose command line names its socket, `podman-<bridge pid>.sock`); `None` when there are none.
fn engine_ticks(bridge: u32) -> Option<u64> {
    let sock = format!("podman-{bridge}.sock");
    let mut total = None;
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmd).contains(&sock) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(p.path().join("stat")) else {
            continue;
        };
        let f: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        // utime and stime: fields 14 and 15 of stat, 12 and 13 after the name.
        let t: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        *total.get_or_insert(0) += t;
    }
    total
}

/// The engine's CPU use over `secs` seconds, in percent of one CPU.
async fn engine_cpu(bridge: u32, secs: u64) -> u64 {
    let before = engine_ticks(bridge).expect("the bridge's own podman service");
    tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
    let after = engine_ticks(bridge).expect("the bridge's own podman service");
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    (after - before) * 100 / (hz * secs)
}

/// `/workspace/out` is a mount point of its own: code cannot replace it with a link (to
/// `/proc/self`, which had kept the engine's copy running for ever at a host CPU, outside every
/// sandbox limit, after the bridge gave up at 30 s). And when the host gives up on a copy (a
/// sparse file of 1 TiB: the read bound), the engine's work ends with it.
#[tokio::test(flavor = "multi_thread")]
async fn out_cannot_be_replaced_by_a_link_and_the_engine_stops_when_the_host_gives_up() {
    // No pool: a refill would be engine work of its own while the engine's CPU is measured.
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_POOL_SIZE", "0")], None).await;
    b.py("print('up')").await.ok();
    let code = r#"
import os
out = "/workspace/out"
for step in (lambda: os.rename(out, "/workspace/was-out"), lambda: os.rmdir(out),
             lambda: os.symlink("/proc/self", out)):
    try:
        step()
    except OSError as e:
        print(type(e).__name__)
print("link" if os.path.islink(out) else "dir" if os.path.isdir(out) else "other")
"#;
    let t0 = std::time::Instant::now();
    let o = b.call(json!({"code": code, "timeout": 120})).await;
    let took = t0.elapsed();
    let o = Outcome(o);
    let cpu = engine_cpu(b.pid, 3).await;
    eprintln!(
        "{} in {took:?}; engine afterwards: {cpu}% of a CPU",
        o.text()
    );
    assert_eq!(o.status(), "ok", "{}", o.text());
    assert_eq!(o.stdout().lines().last(), Some("dir"), "{}", o.text());
    assert!(
        took < std::time::Duration::from_secs(20),
        "{took:?}: {}",
        o.text()
    );
    assert!(!o.text().contains("copied out"), "{}", o.text());
    assert!(
        cpu < 30,
        "the engine kept working after the call: {cpu}% of a CPU"
    );

    // A sparse file of 1 TiB: the host reads its bound, gives up, and the engine stops too.
    let o = b
        .py("f = open('/workspace/out/sparse.bin', 'wb'); f.truncate(1 << 40); f.close()")
        .await
        .ok();
    // Under gVisor the runtime sends the tar through its channel, within the same bytes and
    // its own 25 s: on a busy machine (ptrace platform) the time bound can come first.
    let gave_up = o.text().contains("the rest was not read")
        || (common::isolation().as_deref() == Some("gvisor")
            && o.text().contains("stopped sending /workspace/out early"));
    assert!(gave_up, "{}", o.text());
    let cpu = engine_cpu(b.pid, 3).await;
    eprintln!("after the sparse file: {cpu}% of a CPU");
    assert!(
        cpu < 30,
        "the engine kept copying after the host gave up: {cpu}% of a CPU"
    );
    let o = b.py("print(6 * 7)").await.ok();
    assert!(o.stdout().contains("42"));
    b.shutdown_clean().await;
}
