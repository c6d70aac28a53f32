//! The data profile's image, and the data work it is for, end to end through the real binary,
//! podman and rmcp's client: a declared CSV directory in, a pandas group-by, scipy and
//! scikit-learn on it, a matplotlib chart, a cleaned CSV and a Parquet file out as resource
//! links read back byte for byte (the Parquet also re-read with pyarrow in a fresh session), a
//! helper saved as a skill used by the next bridge process, and the session exported as a
//! notebook. `doctor` names the profile. The image is built by `scripts/setup-debian.sh
//! --test-deps` (`image/build-debian.sh --profile data`); without it the test fails and says so.

use crate::common;

use base64::Engine as _;
use common::{Bridge, Home, Outcome};
use rmcp::model::{ContentBlock, ReadResourceRequestParams, ResourceContents};
use sha2::{Digest, Sha256};

/// The environment that makes a bridge use the data archive: loaded under a reference of its
/// own, tagged with the archive's digest (so the other tests' image is never replaced, and an
/// image loaded from another build of the archive is never taken for this one).
fn image_env() -> Vec<(String, String)> {
    let archive = archive();
    let digest = hex::encode(Sha256::digest(std::fs::read(&archive).unwrap()));
    vec![
        (
            "MCP_BRIDGE_IMAGE".into(),
            format!("mcp-code-bridge-sandbox-data:{}", &digest[..16]),
        ),
        ("MCP_BRIDGE_IMAGE_ARCHIVE".into(), archive),
        ("MCP_BRIDGE_IMAGE_SHA256".into(), digest),
    ]
}

fn archive() -> String {
    std::env::var("MCP_BRIDGE_TEST_DATA_IMAGE_ARCHIVE")
        .ok()
        .filter(|a| std::path::Path::new(a).is_file())
        .unwrap_or_else(|| {
            panic!(
                "MCP_BRIDGE_TEST_DATA_IMAGE_ARCHIVE does not name the data profile's image archive; \
                 scripts/setup-debian.sh --test-deps builds it (or: image/build-debian.sh --profile data \
                 --output data.tar, then MCP_BRIDGE_TEST_DATA_IMAGE_ARCHIVE=data.tar)"
            )
        })
}

fn home_with_sales(sales: &std::path::Path) -> Home {
    let home = Home::new();
    let dir = home.path().join(".config/mcp-code-bridge");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "[[inputs]]\nhost = {:?}\npath = \"/data/sales\"\n",
            sales.display().to_string()
        ),
    )
    .unwrap();
    home
}

async fn read_bytes(b: &Bridge, uri: &str) -> Vec<u8> {
    let r = b
        .client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .unwrap();
    match &r.contents[0] {
        ResourceContents::TextResourceContents { text, .. } => text.as_bytes().to_vec(),
        ResourceContents::BlobResourceContents { blob, .. } => {
            base64::engine::general_purpose::STANDARD
                .decode(blob)
                .unwrap()
        }
        other => panic!("{other:?}"),
    }
}

fn link(o: &Outcome, name: &str) -> String {
    o.0.content
        .iter()
        .find_map(|c| match c {
            ContentBlock::ResourceLink(r) if r.name == name => Some(r.uri.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no resource link {name}: {}", o.text()))
}

fn printed(o: &Outcome, what: &str) -> String {
    o.stdout()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{what} ")))
        .unwrap_or_else(|| panic!("no {what} in {:?}", o.stdout()))
        .to_string()
}

const ANALYSE: &str = r#"
import glob, hashlib, os
import numpy as np, pandas as pd, scipy.stats, sklearn.linear_model
import matplotlib.pyplot as plt
df = pd.concat(pd.read_csv(f) for f in sorted(glob.glob("/data/sales/*.csv")))
df = df[df.amount > 0]                                   # refunds out
by_month = df.groupby("month").amount.sum()
print("totals", by_month.to_dict())
slope = scipy.stats.linregress(by_month.index, by_month.values).slope
model = sklearn.linear_model.LinearRegression().fit(by_month.index.values.reshape(-1, 1), by_month.values)
print("trend", round(slope, 6), round(float(model.coef_[0]), 6))
os.makedirs("/workspace/out", exist_ok=True)
df.to_csv("/workspace/out/clean.csv", index=False)
by_month.to_frame().to_parquet("/workspace/out/by_month.parquet")
fig, ax = plt.subplots(figsize=(3, 2), dpi=60)
by_month.plot(ax=ax)
fig.savefig("/workspace/out/trend.png")
for n in ("clean.csv", "by_month.parquet", "trend.png"):
    print(n, hashlib.sha256(open("/workspace/out/" + n, "rb").read()).hexdigest())
"#;

#[tokio::test(flavor = "multi_thread")]
async fn sales_in_trend_and_files_out_skill_kept_and_notebook_with_the_data_image() {
    let data = tempfile::tempdir().unwrap();
    let sales = data.path().join("sales");
    std::fs::create_dir_all(&sales).unwrap();
    std::fs::write(
        sales.join("q1.csv"),
        "month,amount\n1,100\n2,120\n2,-20\n3,140\n",
    )
    .unwrap();
    std::fs::write(sales.join("q2.csv"), "month,amount\n4,160\n5,180\n5,0\n").unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut env = image_env();
    env.push((
        "MCP_BRIDGE_STATE_DIR".into(),
        state.path().display().to_string(),
    ));
    env.push(("MCP_BRIDGE_SKILLS_SAVE".into(), "allow".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();

    let b = Bridge::start_with(home_with_sales(&sales), &env, None).await;
    let o = b.py(ANALYSE).await.ok();
    assert_eq!(
        printed(&o, "totals"),
        "{1: 100, 2: 120, 3: 140, 4: 160, 5: 180}",
        "{}",
        o.text()
    );
    assert_eq!(printed(&o, "trend"), "20.0 20.0", "{}", o.text());
    // Each file out read back byte for byte.
    for name in ["clean.csv", "by_month.parquet", "trend.png"] {
        let bytes = read_bytes(&b, &link(&o, name)).await;
        assert_eq!(
            hex::encode(Sha256::digest(&bytes)),
            printed(&o, name),
            "{name} differs from what the sandbox wrote"
        );
        if name == "by_month.parquet" {
            assert!(bytes.starts_with(b"PAR1") && bytes.ends_with(b"PAR1"));
        }
    }
    // The helper the model wrote, kept for the next day.
    b.py("def monthly_totals(df):\n    \"\"\"Sales per month, refunds dropped.\"\"\"\n    return df[df.amount > 0].groupby('month').amount.sum()\nfrom mcp import runtime\nruntime.save_skill(monthly_totals)")
        .await
        .ok();
    // The session as a notebook: its cells, outputs and the chart's files are there.
    let nb = b
        .py("import json\nruntime.export_notebook()\nnb = json.load(open('/workspace/out/session.ipynb'))\nlen(nb['cells']), nb['nbformat']")
        .await
        .ok();
    assert_eq!(nb.sc()["value"], "(3, 4)", "{}", nb.text());
    link(&nb, "session.ipynb");
    b.shutdown_clean().await;

    // The next day: a new bridge process, the skill defined, the Parquet re-read with pyarrow.
    let next = Bridge::start_with(home_with_sales(&sales), &env, None).await;
    let o = next
        .py("import glob, pandas as pd, pyarrow\ndf = pd.concat(pd.read_csv(f) for f in sorted(glob.glob('/data/sales/*.csv')))\nmonthly_totals(df).to_dict()")
        .await
        .ok();
    assert_eq!(
        o.sc()["value"],
        "{1: 100, 2: 120, 3: 140, 4: 160, 5: 180}",
        "{}",
        o.text()
    );
    next.shutdown_clean().await;

    // doctor names the profile of the image in use.
    let home = home_with_sales(&sales);
    let out = home
        .command()
        .envs(env.iter().copied())
        .arg("doctor")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("profile data"), "{text}");
}
