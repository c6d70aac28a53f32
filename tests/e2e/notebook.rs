//! The session as a notebook, end to end: a few `run_python` calls through the real binary and
//! rmcp's client into a real podman sandbox, `runtime.export_notebook()`, and the file read back
//! and validated with `nbformat` from PyPI (in the test servers' venv, `mcp-python`), its image
//! decoded.

use crate::common;

use std::io::Write as _;
use std::process::{Command, Stdio};

use base64::Engine as _;
use common::Bridge;
use serde_json::{Value, json};

/// Validates the notebook on stdin with nbformat and prints what the test checks as JSON.
const VALIDATE: &str = r#"
import base64, json, sys
import nbformat
nb = nbformat.reads(sys.stdin.read(), as_version=4)
nbformat.validate(nb)
cells = []
for c in nb.cells:
    outs = []
    for o in c.get("outputs", []):
        d = {"type": o.output_type}
        if o.output_type == "stream":
            d.update(name=o.name, text=o.text)
        elif o.output_type in ("execute_result", "display_data"):
            d.update(mimes=sorted(o.data), text=o.data.get("text/plain"))
            if "image/png" in o.data:
                d["png"] = o.data["image/png"]
            if o.output_type == "execute_result":
                d["count"] = o.execution_count
        elif o.output_type == "error":
            d.update(ename=o.ename, evalue=o.evalue, traceback=o.traceback)
        outs.append(d)
    cells.append({"type": c.cell_type, "count": c.get("execution_count"), "source": c.source, "outputs": outs})
print(json.dumps({"version": [nb.nbformat, nb.nbformat_minor], "cells": cells}))
"#;

/// nbformat's reading of `text`: panics with its message when the notebook is not valid.
fn validate(text: &str) -> Value {
    let python = common::server_bin("mcp-python");
    let mut child = Command::new(&python)
        .args(["-c", VALIDATE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mcp-python");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nbformat refused the notebook (is nbformat installed in {}? scripts/setup-debian.sh \
         --test-deps installs it):\n{}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_exported_session_is_a_valid_notebook_with_its_outputs_and_image() {
    let b = Bridge::start().await;
    b.py("print('hello from the sandbox')").await.ok();
    b.py("total = sum(range(10))\ntotal * 2").await.ok();
    let failed = b.py("{}['missing']").await;
    assert_eq!(failed.error_type(), "KeyError", "{}", failed.text());
    b.py("import matplotlib.pyplot as plt\n\
         fig, ax = plt.subplots(figsize=(2, 2), dpi=50)\n\
         ax.plot([1, 3, 2])\n\
         plt.show()")
        .await
        .ok();
    let export = b
        .py("from mcp import runtime\nprint('exporting')\nruntime.export_notebook()")
        .await
        .ok();
    assert!(
        export.text().contains("/workspace/out/session.ipynb"),
        "export_notebook() returns the path it wrote: {}",
        export.text()
    );
    let read = b
        .py("print(open('/workspace/out/session.ipynb').read(), end='')")
        .await
        .ok();
    let nb = validate(read.stdout());
    assert_eq!(nb["version"], json!([4, 5]));
    let cells = nb["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 5, "one cell per call up to the export: {nb:#}");
    let counts: Vec<_> = cells.iter().map(|c| c["count"].as_i64()).collect();
    assert_eq!(counts, [1, 2, 3, 4, 5].map(Some));

    assert_eq!(cells[0]["source"], "print('hello from the sandbox')");
    assert_eq!(
        cells[0]["outputs"],
        json!([{"type": "stream", "name": "stdout", "text": "hello from the sandbox\n"}])
    );
    assert_eq!(
        cells[1]["outputs"],
        json!([{"type": "execute_result", "mimes": ["text/plain"], "text": "90", "count": 2}])
    );
    let error = &cells[2]["outputs"][0];
    assert_eq!(error["type"], "error");
    assert_eq!(error["ename"], "KeyError");
    assert_eq!(error["evalue"], "'missing'");
    let tb = error["traceback"].as_array().unwrap();
    assert!(
        tb.last().unwrap().as_str().unwrap().contains("KeyError"),
        "{tb:?}"
    );

    let image = &cells[3]["outputs"][0];
    assert_eq!(image["type"], "display_data");
    assert_eq!(image["mimes"], json!(["image/png", "text/plain"]));
    let png = base64::engine::general_purpose::STANDARD
        .decode(image["png"].as_str().unwrap().replace('\n', ""))
        .expect("the image is base64");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    // The IHDR chunk: the figure's size in pixels (2 in x 50 dpi, less the tight bounding box).
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert!(
        (20..=120).contains(&w) && (20..=120).contains(&h),
        "{w}x{h}"
    );

    // The exporting cell, as far as it had run: its code and what it printed before the export.
    assert!(
        cells[4]["source"]
            .as_str()
            .unwrap()
            .contains("export_notebook")
    );
    assert_eq!(
        cells[4]["outputs"],
        json!([{"type": "stream", "name": "stdout", "text": "exporting\n"}])
    );

    // A reset is a new interpreter: its notebook starts empty.
    let fresh = b
        .call(json!({"code": "from mcp import runtime\nruntime.export_notebook('/workspace/out/again.ipynb')\nprint(open('/workspace/out/again.ipynb').read(), end='')", "reset": true}))
        .await;
    let fresh = common::Outcome(fresh).ok();
    let nb = validate(fresh.stdout());
    assert_eq!(nb["cells"].as_array().unwrap().len(), 1, "{nb:#}");

    // The model learns of it from the capabilities resource (not the tool description, whose
    // token budget it would cost on every request).
    let r = b
        .client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "resource://mcp-code-bridge/capabilities",
        ))
        .await
        .unwrap();
    let text = serde_json::to_string(&r.contents).unwrap();
    assert!(text.contains("runtime.export_notebook()"), "{text}");
    let tools = b.client.list_all_tools().await.unwrap();
    assert!(!serde_json::to_string(&tools).unwrap().contains("notebook("));
    b.shutdown_clean().await;
}
