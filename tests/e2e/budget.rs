//! Results that fit the client (`output_budget`): each byte of output once, within the budget
//! of tokens; past it a preview, and the whole output kept as a file that reads back byte for
//! byte by its link and from the next call's code. Through the real binary and real podman,
//! with rmcp's client, the official Python SDK's `Client` and the official TypeScript client, in
//! their default mode (2026-07-28) and the legacy one, over stdio and Streamable HTTP.

use std::time::Duration;

use rmcp::model::{ContentBlock, ReadResourceRequestParams, ResourceContents};
use serde_json::Value;

use crate::common;
use common::served::Served;
use common::{Bridge, Home, Outcome, server_bin};

fn tokens(text: &str) -> usize {
    tiktoken_rs::cl100k_base_singleton()
        .encode_ordinary(text)
        .len()
}

fn texts(o: &Outcome) -> Vec<String> {
    o.0.content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Text(t) => Some(t.text.clone()),
            _ => None,
        })
        .collect()
}

/// The URIs of the reply's resource links, in order.
fn links(o: &Outcome) -> Vec<String> {
    o.0.content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::ResourceLink(l) => Some(l.uri.clone()),
            _ => None,
        })
        .collect()
}

fn meta(o: &Outcome) -> Value {
    o.0.meta.as_ref().unwrap().0["mcp-code-bridge/result"].clone()
}

async fn read_text(b: &Bridge, uri: &str) -> String {
    let r = b
        .client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .expect("resources/read of a kept part");
    match &r.contents[0] {
        ResourceContents::TextResourceContents { text, .. } => text.clone(),
        other => panic!("{other:?}"),
    }
}

/// A print within the budget comes back whole and once: the result is the printed text and
/// less than 2 KiB besides.
#[tokio::test(flavor = "multi_thread")]
async fn a_print_within_the_budget_travels_once() {
    let b = Bridge::start().await;
    let r = b.py("print('word ' * 4000, end='')").await.ok();
    assert_eq!(r.stdout(), "word ".repeat(4000));
    let wire = serde_json::to_string(&r.0).unwrap();
    assert!(
        wire.len() <= 20_000 + 2048,
        "a 20,000-character print made a {}-byte result",
        wire.len()
    );
    assert!(meta(&r).get("kept").is_none());
    b.shutdown().await;
}

/// A 150,000-character print: the result is within 8,000 tokens (the default), shows the head
/// and the tail with a line saying where the whole is, and the whole reads back byte for byte
/// by `resources/read` and from the next call's code; what the code printed next is its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_long_print_is_a_preview_and_its_whole_is_a_file() {
    let b = Bridge::start().await;
    let code = "text = ''.join(f'{i:06} ' + ('word' if i % 9 else 'end\\n') for i in range(40000))[:150000]\nprint(text, end='')";
    let expected: String = (0..40000)
        .map(|i| format!("{i:06} {}", if i % 9 != 0 { "word" } else { "end\n" }))
        .collect::<String>()[..150_000]
        .to_string();
    let r = b.py(code).await.ok();
    let all = texts(&r).join("\n");
    let n = tokens(&all);
    assert!(n <= 8000, "{n} tokens of text in the result");
    let stdout = r.stdout().to_string();
    assert!(stdout.starts_with(&expected[..2000]), "{}", &stdout[..200]);
    assert!(stdout.ends_with(&expected[expected.len() - 1000..]));
    let m = meta(&r);
    let kept = &m["kept"][0];
    assert_eq!(kept["part"], "stdout");
    assert_eq!(kept["size"], 150_000);
    let path = kept["path"].as_str().unwrap();
    assert!(path.starts_with("/workspace/out/.outputs/"), "{m}");
    assert!(
        stdout.contains(&format!(
            "bytes left out; the whole stdout is {path} ({})",
            kept["uri"].as_str().unwrap()
        )),
        "{all}"
    );
    // A link to it in the content, once.
    let links = links(&r);
    assert_eq!(links, vec![kept["uri"].as_str().unwrap().to_string()]);
    assert_eq!(read_text(&b, kept["uri"].as_str().unwrap()).await, expected);
    let again = b
        .py(&format!(
            "data = open({path:?}).read()\nprint(len(data), data[-20:] == {:?})",
            &expected[expected.len() - 20..]
        ))
        .await
        .ok();
    assert_eq!(again.stdout(), "150000 True\n");
    // The file is not announced again as a new file of /workspace/out.
    assert!(!again.text().contains("[file]"), "{}", again.text());
    b.shutdown().await;
}

/// Outputs an attacker would choose: a 50 MiB line without a newline, a million short lines,
/// invalid UTF-8, output written by a thread after its call ended. Each gives a result within
/// the budget, quickly, and the session stays usable.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_outputs_give_bounded_results_and_the_session_stays() {
    let b = Bridge::start().await;
    b.py("x = 41").await.ok();
    for code in [
        "import sys\nsys.stdout.write('y' * (50 << 20))",
        "import sys\nsys.stdout.write('a\\n' * 1_000_000)",
        "import os\nos.write(1, b'\\xff\\xfe\\x80' * 400_000)",
        "import sys\nsys.stderr.write('E' * 300_000)\nprint('o' * 300_000)\n'v' * 9000",
    ] {
        let started = std::time::Instant::now();
        let r = b.py(code).await.ok();
        let n = tokens(&texts(&r).join("\n"));
        assert!(n <= 8000, "{n} tokens for {code:?}");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{code:?} took {:?}",
            started.elapsed()
        );
        assert!(!meta(&r)["kept"].as_array().unwrap().is_empty(), "{code:?}");
    }
    b.py("import threading, time\ndef late():\n    time.sleep(0.5)\n    print('L' * 2_000_000)\nthreading.Thread(target=late).start()")
        .await
        .ok();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = b.py("print(x + 1)").await.ok();
    assert_eq!(r.stdout(), "42\n");
    assert!(tokens(&r.text()) < 200, "{}", r.text());
    b.shutdown().await;
}

/// A full `/workspace/out`: the preview still comes back, the whole output is still readable by its
/// link, and the result says it could not be written where the code would read it.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_workspace_keeps_the_preview_and_says_so() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_WORKSPACE_SIZE", "8m")], None).await;
    let r = b
        .py("import os\nos.makedirs('/workspace/out', exist_ok=True)\ntry:\n    open('/workspace/out/fill', 'wb').write(b'0' * (9 << 20))\nexcept OSError:\n    pass\nprint('z ' * 100_000)")
        .await
        .ok();
    let stdout = r.stdout().to_string();
    assert!(
        stdout.contains("could not be written to /workspace/out/.outputs/"),
        "{}",
        stdout
            .lines()
            .find(|l| l.contains("left out"))
            .unwrap_or("no marker line")
    );
    let kept = &meta(&r)["kept"][0];
    assert!(kept.get("path").is_none(), "{kept}");
    assert_eq!(
        read_text(&b, kept["uri"].as_str().unwrap()).await,
        "z ".repeat(100_000) + "\n"
    );
    assert!(tokens(&texts(&r).join("\n")) <= 8000);
    assert_eq!(b.py("print(1)").await.ok().stdout(), "1\n");
    b.shutdown().await;
}

/// What the code chooses besides its output counts against the budget too: 64 files whose
/// paths are ~400 bytes each (two directories deep, a bidi override in each) give a reply whose text, link names, titles
/// and URIs together stay within `output_budget` (8,000 tokens: the links of the files that
/// fit, a line for the rest); the names the model reads are cut with the
/// count of what was cut, escaped; every file stays listed by `resources/list`.
#[tokio::test(flavor = "multi_thread")]
async fn file_names_count_against_the_budget() {
    let b = Bridge::start().await;
    let r = b
        .py("import os\nfor i in range(64):\n    d = '/workspace/out/' + '/'.join(['\\u202e' + 'D' * 120 + str(i)] * 2)\n    os.makedirs(d, exist_ok=True)\n    open(d + '/' + 'n' * 150 + str(i), 'w').write('x')\nprint('ok')")
        .await
        .ok();
    assert_eq!(r.stdout(), "ok\n");
    let mut chosen = String::new();
    let mut linked = 0;
    for c in &r.0.content {
        match c {
            ContentBlock::Text(t) => chosen.push_str(&t.text),
            ContentBlock::ResourceLink(l) => {
                linked += 1;
                chosen.push_str(&l.name);
                chosen.push_str(l.title.as_deref().unwrap_or(""));
                chosen.push_str(&l.uri);
                assert!(l.name.chars().count() < 140, "{}", l.name);
                assert!(l.name.contains("…(cut: "), "{}", l.name);
                assert!(
                    !l.name.contains('\u{202e}') && l.name.contains("\\u{202e}"),
                    "a bidi override reached the model unescaped: {}",
                    l.name
                );
            }
            _ => {}
        }
    }
    let n = tokens(&chosen);
    assert!(n <= 8000, "{n} tokens in the reply's text and links");
    assert!((1..64).contains(&linked), "{linked} of 64 files linked");
    assert!(
        chosen.contains("past the output budget: resources/list lists them all"),
        "{chosen}"
    );
    let listed = b.client.list_all_resources().await.unwrap();
    assert!(listed.len() >= 64, "{} resources listed", listed.len());
    b.shutdown().await;
}

/// A smaller `output_budget` is obeyed, and the budget counts the value and the traceback too.
#[tokio::test(flavor = "multi_thread")]
async fn the_budget_is_the_users_and_covers_values_and_tracebacks() {
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_OUTPUT_BUDGET", "1000")], None).await;
    let r = b
        .py("def f(n):\n    return f(n + 1) if n < 50 else 1 / 0\nprint('p ' * 3000)\nf(0)")
        .await;
    assert_eq!(r.status(), "error");
    let n = tokens(&texts(&r).join("\n"));
    assert!(n <= 1000, "{n} tokens");
    let v = b.py("'word ' * 1800").await.ok();
    assert!(tokens(&texts(&v).join("\n")) <= 1000);
    assert_eq!(meta(&v)["kept"][0]["part"], "value");
    b.shutdown().await;
}

fn check_client_result(v: &Value, what: &str) {
    let all: String = v["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(tokens(&all) <= 8000, "{what}: {} tokens", tokens(&all));
    assert_eq!(v["structured"], Value::Null, "{what}: no structuredContent");
    assert_eq!(v["read_sha"], v["printed_sha"], "{what}: resources/read");
    assert_eq!(
        v["file_sha"], v["printed_sha"],
        "{what}: the file in the sandbox"
    );
    assert_eq!(v["links"].as_array().unwrap().len(), 1, "{what}: {v}");
}

fn run_client(cmd: &mut std::process::Command, home: &Home, what: &str) -> Value {
    let out = cmd
        .env_clear()
        .envs(home.env())
        .env("NODE_PATH", common::oidc::node_modules())
        .current_dir(home.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The official SDKs, in their default mode and the legacy one, over stdio and HTTP: the
/// 150,000-character print is within the budget and its whole reads back byte for byte.
#[tokio::test(flavor = "multi_thread")]
async fn the_official_clients_get_a_preview_and_the_whole_by_its_link() {
    let home = Home::new();
    let served = Served::start(Home::new(), &[], &[]);
    for (mode, protocol) in [("auto", "2026-07-28"), ("legacy", "2025-11-25")] {
        for target in [common::BIN.to_string(), served.url.clone()] {
            let what = format!("Python SDK, {mode}, {target}");
            let v = run_client(
                std::process::Command::new(server_bin("mcp-python"))
                    .arg(common::fixture("sdk_long_output.py"))
                    .args([mode, &target, "150000"]),
                &home,
                &what,
            );
            assert_eq!(v["protocol"], protocol, "{what}");
            check_client_result(&v, &what);
            let what = format!("TypeScript client, {mode}, {target}");
            let v = run_client(
                std::process::Command::new(server_bin("node"))
                    .arg(common::fixture("ts_long_output.mjs"))
                    .args([mode, &target, "150000"]),
                &home,
                &what,
            );
            check_client_result(&v, &what);
        }
    }
    drop(served);
}

/// Python that defines `png(seed)`, a small valid PNG whose bytes depend on `seed`, and `P`,
/// an object `display()` shows as that PNG.
pub const PNG_CODE: &str = "import struct, zlib
def png(seed, w=4, h=4):
    raw = b''.join(b'\\x00' + bytes((seed * 37 + x) % 256 for x in range(w * 3)) for _ in range(h))
    def chunk(t, d):
        return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    return (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0))
            + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
class P:
    def __init__(self, b):
        self.b = b
    def _repr_png_(self):
        return self.b
";

/// Images past a reply's limits (16 per reply) are files with links, not dropped: the 17th and
/// 18th of one call read back byte for byte, and the reply says where they went.
#[tokio::test(flavor = "multi_thread")]
async fn images_past_the_replys_limit_are_files_with_links() {
    let b = Bridge::start().await;
    let code = format!(
        "{PNG_CODE}for i in range(18):\n    display(P(png(i)))\nimport hashlib\nprint(hashlib.sha256(png(16)).hexdigest(), hashlib.sha256(png(17)).hexdigest())"
    );
    let r = b.py(&code).await.ok();
    assert_eq!(meta(&r)["images"], 16, "{}", r.text());
    let links = links(&r);
    assert_eq!(links.len(), 2, "{links:?}");
    assert!(links.iter().all(|l| l.contains("/.outputs/")), "{links:?}");
    assert!(
        r.text()
            .contains("2 image(s) from display() are files instead of images"),
        "{}",
        r.text()
    );
    let want: Vec<String> = r.stdout().split_whitespace().map(str::to_string).collect();
    for (uri, want) in links.iter().zip(&want) {
        let c = b
            .client
            .read_resource(ReadResourceRequestParams::new(uri.as_str()))
            .await
            .unwrap();
        let ResourceContents::BlobResourceContents { blob, .. } = &c.contents[0] else {
            panic!("{c:?}")
        };
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(blob)
            .unwrap();
        use sha2::Digest as _;
        assert_eq!(&hex::encode(sha2::Sha256::digest(&bytes)), want);
    }
    b.shutdown().await;
}

/// `exec -` reads the code from stdin, prints everything (no budget: a 150,000-character print
/// arrives whole), and `--out DIR` writes the displayed images and the files of /workspace/out.
#[test]
fn exec_reads_stdin_prints_everything_and_writes_out() {
    use std::io::Write as _;
    let home = Home::new();
    let dir = home.path().join("results");
    let code = format!(
        "{PNG_CODE}display(P(png(3)))\nimport os\nos.makedirs('/workspace/out/sub', exist_ok=True)\nopen('/workspace/out/sub/data.csv', 'w').write('a,b\\n1,2\\n')\nprint('x' * 150000)"
    );
    let mut child = home
        .command()
        .args(["exec", "-", "--out", dir.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(code.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(&format!("{}\n", "x".repeat(150_000))),
        "{stdout:.200}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("sub/data.csv")).unwrap(),
        "a,b\n1,2\n"
    );
    let png = std::fs::read(dir.join("image-1.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{png:?}");
    assert!(stdout.contains("[wrote "), "{stdout:.400}");
}
