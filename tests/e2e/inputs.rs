//! Files in, end to end: the user's declared `[[inputs]]` (a CSV directory and a single file)
//! copied into the sandbox at `/data` (a tar unpacked there by a process run as the sandbox's
//! user, so the files are that user's under every host identity), read with pandas; a
//! link inside an input to a host secret is not followed; what the code changes stays in the
//! sandbox and a reset brings the original back; an input over `inputs_size` is a notice and
//! the bridge serves on; `exec --input` for one-shot runs. Real binary, real podman, rmcp's
//! client.

use crate::common;

use std::path::Path;

use common::{Bridge, Home};

/// A home whose configuration declares `inputs` (TOML `[[inputs]]` tables) and `extra` keys.
fn home_with(inputs: &[(&Path, Option<&str>)], extra: &str) -> Home {
    let home = Home::new();
    let dir = home.path().join(".config/mcp-code-bridge");
    std::fs::create_dir_all(&dir).unwrap();
    let mut toml = format!("{extra}\n");
    for (host, path) in inputs {
        toml.push_str(&format!(
            "[[inputs]]\nhost = {:?}\n",
            host.display().to_string()
        ));
        if let Some(p) = path {
            toml.push_str(&format!("path = {p:?}\n"));
        }
    }
    std::fs::write(dir.join("config.toml"), toml).unwrap();
    home
}

/// A sales directory (two regions, one file in a subdirectory), a link in it to a secret
/// beside it, and a single JSON file.
fn host_data(root: &Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let sales = root.join("sales");
    std::fs::create_dir_all(sales.join("2025")).unwrap();
    std::fs::write(
        sales.join("north.csv"),
        "region,amount\nnorth,10\nnorth,5\n",
    )
    .unwrap();
    std::fs::write(
        sales.join("2025/south.csv"),
        "region,amount\nsouth,7\nsouth,1\n",
    )
    .unwrap();
    let secret = format!("host-secret-{}", std::process::id());
    std::fs::write(root.join("secret.txt"), &secret).unwrap();
    std::os::unix::fs::symlink(root.join("secret.txt"), sales.join("leak.csv")).unwrap();
    let rates = root.join("rates.json");
    std::fs::write(&rates, r#"{"eur": 0.9}"#).unwrap();
    (sales, rates, secret)
}

#[tokio::test(flavor = "multi_thread")]
async fn declared_inputs_are_copied_in_and_nothing_else_of_the_host() {
    let data = tempfile::tempdir().unwrap();
    let (sales, rates, secret) = host_data(data.path());
    let home = home_with(
        &[(&sales, None), (&rates, Some("/data/ref/rates.json"))],
        "",
    );
    let b = Bridge::start_with(home, &[], None).await;

    let first = b
        .py("import glob, pandas as pd\n\
             files = sorted(glob.glob('/data/sales/**/*.csv', recursive=True))\n\
             df = pd.concat(pd.read_csv(f) for f in files)\n\
             print(files)\n\
             df.groupby('region').amount.sum().to_dict()")
        .await
        .ok();
    assert_eq!(
        first.sc()["value"],
        "{'north': 15, 'south': 8}",
        "{}",
        first.text()
    );
    assert!(
        first.stdout().contains("/data/sales/2025/south.csv") && !first.stdout().contains("leak"),
        "{}",
        first.text()
    );
    assert!(
        first.text().contains("1 symbolic link(s) not copied"),
        "the skipped link is a notice of the first call: {}",
        first.text()
    );
    let single = b
        .py("import json\njson.load(open('/data/ref/rates.json'))")
        .await
        .ok();
    assert_eq!(single.sc()["value"], "{'eur': 0.9}");
    // The sandbox user's files, in its own user namespace too (where the engine's archive API,
    // writing as the host's root, was refused them).
    let owner = b
        .py("import os\nst = os.stat('/data/ref/rates.json')\n(st.st_uid == os.getuid(), st.st_gid == os.getgid(), oct(st.st_mode & 0o777))")
        .await
        .ok();
    assert_eq!(
        owner.sc()["value"],
        "(True, True, '0o644')",
        "{}",
        owner.text()
    );

    // The secret the link pointed to is nowhere in the sandbox.
    let grep = b
        .py(&format!(
            "import os\nhits = []\nfor d, _, fs in os.walk('/data'):\n    for f in fs:\n        p = os.path.join(d, f)\n        if {secret:?} in open(p, errors='replace').read():\n            hits.append(p)\nhits"
        ))
        .await
        .ok();
    assert_eq!(grep.sc()["value"], "[]", "{}", grep.text());

    // Copies: what the code changes stays in the sandbox; a reset brings the originals back.
    b.py("import os\nos.remove('/data/sales/north.csv')\nopen('/data/sales/2025/south.csv', 'w').write('changed')")
        .await
        .ok();
    assert_eq!(
        std::fs::read_to_string(sales.join("2025/south.csv")).unwrap(),
        "region,amount\nsouth,7\nsouth,1\n"
    );
    assert!(sales.join("north.csv").exists());
    let after = b
        .call(serde_json::json!({"code": "import os\nsorted(os.listdir('/data/sales')), open('/data/sales/2025/south.csv').read()[:6]", "reset": true}))
        .await;
    let after = common::Outcome(after);
    assert_eq!(
        after.sc()["value"],
        "(['2025', 'north.csv'], 'region')",
        "{}",
        after.text()
    );
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_input_over_the_cap_is_a_notice_and_the_bridge_serves_on() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("big.bin"), vec![7u8; 200 << 10]).unwrap();
    std::fs::write(data.path().join("small.txt"), "small").unwrap();
    let missing = data.path().join("not-there");
    let home = home_with(
        &[
            (&data.path().join("big.bin"), None),
            (&data.path().join("small.txt"), None),
            (&missing, None),
        ],
        "inputs_size = \"64k\"",
    );
    let b = Bridge::start_with(home, &[], None).await;
    let o = b.py("import os\nsorted(os.listdir('/data'))").await.ok();
    assert_eq!(o.sc()["value"], "['small.txt']", "{}", o.text());
    let t = o.text();
    assert!(t.contains("inputs_size"), "the cap is named: {t}");
    assert!(
        t.contains("not-there") && t.contains("[[inputs]]"),
        "the missing input is named: {t}"
    );
    assert_eq!(b.py("1 + 1").await.ok().sc()["value"], "2");
    b.shutdown_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_takes_inputs_from_the_command_line() {
    let data = tempfile::tempdir().unwrap();
    let csv = data.path().join("q1.csv");
    std::fs::write(&csv, "a,b\n1,2\n3,4\n").unwrap();
    let home = Home::new();
    let out = home
        .command()
        .env("MCP_BRIDGE_LOG_LEVEL", "warn")
        .args([
            "exec",
            "--input",
            &csv.display().to_string(),
            "--input",
            &format!("{}:/data/again/q.csv", csv.display()),
            "import pandas as pd\nprint(pd.read_csv('/data/q1.csv').b.sum(), open('/data/again/q.csv').read().count('\\n'))",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "6 3",
        "{stderr}"
    );
    // A sandbox path outside /data is refused before anything starts.
    let bad = home
        .command()
        .args(["exec", "--input", &format!("{}:/etc/x", csv.display()), "1"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("under /data/"));
}
