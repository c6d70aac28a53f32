//! The binary as people and clients meet it: bad configuration, no runtime, `exec`, protocol
//! errors, and the image loaded from its archive on first use.

mod common;

use std::process::Command;

use common::{Bridge, Home};
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams};
use serde_json::json;

#[test]
fn bad_config_values_name_key_value_and_source() {
    let home = Home::new();
    let out = home
        .command()
        .env("MCP_BRIDGE_TIMEOUT", "soonish")
        .arg("config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`timeout`") && err.contains("soonish") && err.contains("MCP_BRIDGE_TIMEOUT"),
        "{err}"
    );

    let cfg = home.path().join("bad.toml");
    std::fs::write(&cfg, "memory = \"lots\"\n").unwrap();
    let out = home
        .command()
        .args(["--config", cfg.to_str().unwrap(), "config"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`memory`") && err.contains("lots") && err.contains("bad.toml"),
        "{err}"
    );

    let out = home
        .command()
        .env("MCP_BRIDGE_LOG_LEVEL", "WARNING")
        .env("MCP_BRIDGE_MEMORY", "1g")
        .arg("config")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("memory") && l.contains("1g") && l.contains("environment")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("pids") && l.contains("128") && l.contains("default")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn initialize_and_list_tools_need_no_runtime_and_run_python_says_what_is_missing() {
    let home = Home::new();
    let b = Bridge::start_with(
        home,
        &[("MCP_BRIDGE_RUNTIME", "unix:///nonexistent/engine.sock")],
        None,
    )
    .await;
    let tools = b.client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].name, "run_python");
    let r = b.py("print(1)").await;
    assert!(r.is_error());
    assert!(
        r.text().contains("/nonexistent/engine.sock")
            && r.text().contains("no container engine answered"),
        "{}",
        r.text()
    );
    // Still serving.
    assert_eq!(b.client.list_all_tools().await.unwrap().len(), 1);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn protocol_errors_for_unknown_tools_and_wrong_argument_types() {
    let b = Bridge::start_with(
        Home::new(),
        &[("MCP_BRIDGE_RUNTIME", "unix:///nonexistent.sock")],
        None,
    )
    .await;
    let e = b
        .client
        .call_tool(CallToolRequestParams::new("rm_rf"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("run_python"), "{e}");
    let args = json!({"code": 42}).as_object().cloned().unwrap();
    let e = b
        .client
        .call_tool(CallToolRequestParams::new("run_python").with_arguments(args))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("invalid"), "{e}");
    let r = b
        .client
        .read_resource(ReadResourceRequestParams::new(
            "resource://mcp-code-bridge/capabilities",
        ))
        .await
        .unwrap();
    let text = serde_json::to_string(&r.contents).unwrap();
    assert!(text.contains("search_tool_docs"), "{text}");
    b.shutdown().await;
}

#[test]
fn exec_prints_output_and_exit_status_reflects_success() {
    let home = Home::new();
    let out = home
        .command()
        .args(["exec", "print(6 * 7)"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");

    let out = home
        .command()
        .args([
            "exec",
            "import sys\nprint('partial')\nraise ValueError('nope')",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "partial\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("ValueError: nope"));

    let f = home.path().join("code.py");
    std::fs::write(&f, "x = 3\nx * 2\n").unwrap();
    let out = home
        .command()
        .args(["exec", "-f", f.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "6\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_image_is_loaded_from_its_archive_on_first_use() {
    // A tag no other test uses, so this bridge must load the archive itself.
    let tag = format!("mcp-code-bridge-sandbox:first-use-{}", std::process::id());
    let b = Bridge::start_with(Home::new(), &[("MCP_BRIDGE_IMAGE", &tag)], None).await;
    let before = Command::new("podman")
        .args(["image", "exists", &tag])
        .status()
        .unwrap();
    assert!(!before.success(), "{tag} exists before the first call");
    b.py("print('loaded')").await.ok();
    assert!(
        b.home.log().contains("sandbox image loaded"),
        "{}",
        b.home.log()
    );
    assert!(
        Command::new("podman")
            .args(["image", "exists", &tag])
            .status()
            .unwrap()
            .success()
    );
    b.shutdown().await;
    let _ = Command::new("podman").args(["rmi", "-f", &tag]).output();
}

#[test]
fn a_gzipped_archive_loads_and_a_wrong_sha256_loads_nothing() {
    use sha2::Digest;
    use std::io::Write;
    let home = Home::new();
    let gz = home.path().join("sandbox.tar.gz");
    {
        let mut enc = flate2::write::GzEncoder::new(
            std::fs::File::create(&gz).unwrap(),
            flate2::Compression::fast(),
        );
        std::io::copy(
            &mut std::fs::File::open(common::image_archive()).unwrap(),
            &mut enc,
        )
        .unwrap();
        enc.finish().unwrap().flush().unwrap();
    }
    let digest = hex::encode(sha2::Sha256::digest(std::fs::read(&gz).unwrap()));
    let tag = format!("mcp-code-bridge-sandbox:gz-{}", std::process::id());
    let exists = || {
        Command::new("podman")
            .args(["image", "exists", &tag])
            .status()
            .unwrap()
            .success()
    };
    assert!(!exists());

    let out = home
        .command()
        .env("MCP_BRIDGE_IMAGE", &tag)
        .env("MCP_BRIDGE_IMAGE_ARCHIVE", &gz)
        .env("MCP_BRIDGE_IMAGE_SHA256", "0".repeat(64))
        .args(["exec", "print(1)"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sha256 mismatch") && err.contains(&digest),
        "{err}"
    );
    assert!(!exists(), "a corrupt archive must load nothing");

    let out = home
        .command()
        .env("MCP_BRIDGE_IMAGE", &tag)
        .env("MCP_BRIDGE_IMAGE_ARCHIVE", &gz)
        .env("MCP_BRIDGE_IMAGE_SHA256", &digest)
        .args(["exec", "print('from gz')"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from gz\n");
    assert!(exists());
    let _ = Command::new("podman").args(["rmi", "-f", &tag]).output();
}

#[test]
fn an_executable_archive_is_run_and_its_output_loaded() {
    // Nix's streamLayeredImage makes a script that prints the archive: the same shape.
    use std::os::unix::fs::PermissionsExt;
    let home = Home::new();
    let script = home.path().join("stream-image");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec cat '{}'\n",
            common::image_archive().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tag = format!("mcp-code-bridge-sandbox:stream-{}", std::process::id());
    let out = home
        .command()
        .env("MCP_BRIDGE_IMAGE", &tag)
        .env("MCP_BRIDGE_IMAGE_ARCHIVE", &script)
        .args(["exec", "print('streamed')"])
        .output()
        .unwrap();
    let _ = Command::new("podman").args(["rmi", "-f", &tag]).output();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "streamed\n");
}

#[test]
fn a_missing_image_without_an_archive_says_how_to_get_one() {
    let home = Home::new();
    let out = home
        .command()
        .env("MCP_BRIDGE_IMAGE", "no-such-sandbox-image:never")
        .env_remove("MCP_BRIDGE_IMAGE_ARCHIVE")
        .env("MCP_BRIDGE_IMAGE_ARCHIVE", "")
        .args(["exec", "print(1)"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-such-sandbox-image:never")
            && err.contains("build-debian.sh")
            && err.contains("MCP_BRIDGE_IMAGE_ARCHIVE"),
        "{err}"
    );
}
