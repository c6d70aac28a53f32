//! The binary as people and clients meet it: bad configuration, no runtime, `exec`, protocol
//! errors, and the image loaded from its archive on first use.

use crate::common;

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

    // Each thing said once, in plain words.
    let out = home
        .command()
        .env("MCP_BRIDGE_OUTPUT_MODE", "fancy")
        .arg("config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim_end(),
        "error: invalid value for `output_mode` from environment variable \
         MCP_BRIDGE_OUTPUT_MODE: `fancy` is not one of: compact, toon"
    );
    let out = home
        .command()
        .env("MCP_BRIDGE_CONTAINER_USER", "0:0")
        .arg("config")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(
            "error: invalid value for `container_user` from environment variable \
             MCP_BRIDGE_CONTAINER_USER: the sandbox never runs as root"
        ),
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
    // No warm-up, which would load it right after initialize: this is about the first call.
    let b = Bridge::start_with(
        Home::new(),
        &[
            ("MCP_BRIDGE_IMAGE", &tag),
            ("MCP_BRIDGE_WARM_START", "false"),
        ],
        None,
    )
    .await;
    assert!(
        !common::image_exists(&tag),
        "{tag} exists before the first call"
    );
    b.py("print('loaded')").await.ok();
    let log = b.home.log();
    assert!(log.contains("sandbox image loaded"), "{log}");
    // Progress is logged while the archive streams, each amount once.
    let progress: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("loading sandbox image…"))
        .collect();
    assert!(!progress.is_empty(), "no progress was logged:\n{log}");
    let mut seen = std::collections::HashSet::new();
    assert!(
        progress.iter().all(|l| seen.insert(l.split("mib=").nth(1))),
        "a progress line repeats:\n{}",
        progress.join("\n")
    );
    assert!(common::image_exists(&tag));
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
    let exists = || common::image_exists(&tag);
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
    let exists = || common::image_exists(&tag);

    // A stream cannot be hashed before it is sent: the digest is checked as it streams, and a
    // mismatch ends the upload. That is what the error says, not how the upload broke.
    let out = home
        .command()
        .env("MCP_BRIDGE_IMAGE", &tag)
        .env("MCP_BRIDGE_IMAGE_ARCHIVE", &script)
        .env("MCP_BRIDGE_IMAGE_SHA256", "0".repeat(64))
        .args(["exec", "print('streamed')"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let digest = archive_sha256();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "error: sha256 mismatch: image archive {} has {digest}, but image_sha256 expects {}; nothing was loaded. \
             The archive is damaged or is not the one configured: `mcp-code-bridge doctor` says",
            script.display(),
            "0".repeat(64)
        )),
        "{err}"
    );
    for transport in ["hyper", "SendRequest", "failed after"] {
        assert!(!err.contains(transport), "{err}");
    }
    assert!(!exists(), "a mismatching stream must load nothing");

    let out = home
        .command()
        .env("MCP_BRIDGE_IMAGE", &tag)
        .env("MCP_BRIDGE_IMAGE_ARCHIVE", &script)
        .env("MCP_BRIDGE_IMAGE_SHA256", &digest)
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

/// The sha256 of the test image archive, in hex.
fn archive_sha256() -> String {
    use sha2::Digest;
    use std::io::Read;
    let mut h = sha2::Sha256::new();
    let mut f = std::fs::File::open(common::image_archive()).unwrap();
    let mut buf = vec![0; 1 << 20];
    loop {
        match f.read(&mut buf).unwrap() {
            0 => return hex::encode(h.finalize()),
            n => h.update(&buf[..n]),
        }
    }
}

/// A config file as a hostile or stale machine would have it: another image, an archive that is
/// not there and its digest, a memory limit no test expects, and a server.
fn hostile_system_config(home: &Home) -> std::path::PathBuf {
    let path = home.path().join("etc-config.toml");
    std::fs::write(
        &path,
        format!(
            "image = \"hostile-image:never\"\nimage_archive = \"/nonexistent/hostile.tar\"\n\
             image_sha256 = \"{}\"\nmemory = \"3g\"\n\n[servers.hostile]\ncommand = \"hostile-server\"\n",
            "0".repeat(64)
        ),
    )
    .unwrap();
    path
}

fn config_output(cmd: &mut Command) -> String {
    let out = cmd.arg("config").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_harness_reads_no_system_config_and_the_variable_moves_it() {
    let home = Home::new();
    let hostile = hostile_system_config(&home);

    // Unset, the system file is /etc/mcp-code-bridge/config.toml: `config` names it (read, or
    // looked at when it does not exist).
    let text = config_output(home.command().env_remove(common::NO_SYSTEM_CONFIG.0));
    assert!(text.contains("/etc/mcp-code-bridge/config.toml"), "{text}");

    // The harness's environment turns it off: nothing of it, and `config` says so.
    let text = config_output(&mut home.command());
    assert!(!text.contains("/etc/mcp-code-bridge"), "{text}");
    assert!(
        text.contains("# no system config file (MCP_BRIDGE_SYSTEM_CONFIG=none)"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("memory ") && l.contains("512m") && l.ends_with("# default")),
        "{text}"
    );

    // Pointed at a file, that file is the system layer, below the environment.
    let text = config_output(
        home.command()
            .env(common::NO_SYSTEM_CONFIG.0, &hostile)
            .env("MCP_BRIDGE_IMAGE", "from-env:1"),
    );
    let from = format!("# {}", hostile.display());
    for key in ["memory ", "servers.hostile "] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(key) && l.ends_with(&from)),
            "{key}: {text}"
        );
    }
    assert!(
        text.lines().any(|l| l.starts_with("image ")
            && l.contains("from-env:1")
            && l.ends_with("# environment variable MCP_BRIDGE_IMAGE")),
        "{text}"
    );
    // The harness's archive (environment) is not the one the file's digest belongs to.
    assert!(
        text.lines().any(|l| l.starts_with("image_sha256 ")
            && l.contains("(unset)")
            && l.ends_with("etc-config.toml, ignored (see the note below)")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "# note: ignoring image_sha256 from {}: it is the digest of the image_archive that layer names (/nonexistent/hostile.tar)",
            hostile.display()
        )),
        "{text}"
    );

    // A path that is not there is an error, not a silently empty layer.
    let out = home
        .command()
        .env(common::NO_SYSTEM_CONFIG.0, home.path().join("nope.toml"))
        .arg("config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nope.toml (from MCP_BRIDGE_SYSTEM_CONFIG) does not exist")
            && err.contains("hint: "),
        "{err}"
    );
}

#[test]
fn a_hostile_system_config_does_not_break_a_bridge_given_its_own_archive() {
    // What a machine set up with `scripts/setup-debian.sh --configure` does to a bridge started
    // with another archive: the file's image archive is missing and its digest is of that one.
    // The archive from the environment loads, unchecked by the other archive's digest.
    let home = Home::new();
    let hostile = hostile_system_config(&home);
    let tag = format!("mcp-code-bridge-sandbox:hostile-{}", std::process::id());
    let out = home
        .command()
        .env(common::NO_SYSTEM_CONFIG.0, &hostile)
        .env("MCP_BRIDGE_IMAGE", &tag)
        .env("MCP_BRIDGE_MEMORY", "512m")
        .args(["exec", "print('despite it')"])
        .output()
        .unwrap();
    let _ = Command::new("podman").args(["rmi", "-f", &tag]).output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "despite it\n");
    assert!(err.contains("ignoring image_sha256 from"), "{err}");
}

/// `doctor` with an engine that is not there (so it checks the configuration only), with the
/// harness's environment minus its image archive, plus `env`.
fn doctor(home: &Home, env: &[(&str, &std::ffi::OsStr)], quick: bool) -> String {
    let mut cmd = home.command();
    cmd.env_remove("MCP_BRIDGE_IMAGE_ARCHIVE")
        .env("MCP_BRIDGE_RUNTIME", "unix:///nonexistent/engine.sock")
        .envs(env.iter().copied())
        .arg("doctor");
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "the engine check fails");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn doctor_checks_the_archive_and_names_where_it_came_from_and_what_rebuilds_it() {
    use std::ffi::OsStr;
    let home = Home::new();
    let sys = home.path().join("system.toml");
    let sys_env = |p: &std::path::Path| (common::NO_SYSTEM_CONFIG.0, p.as_os_str().to_owned());

    // Written by the set-up script, whose archive is gone: re-run it.
    std::fs::write(
        &sys,
        format!(
            "# Written by mcp-code-bridge's scripts/setup-debian.sh --configure.\n\
             image_archive = \"/nonexistent/cache/sandbox.tar\"\nimage_sha256 = \"{}\"\n",
            "1".repeat(64)
        ),
    )
    .unwrap();
    let (k, v) = sys_env(&sys);
    let text = doctor(&home, &[(k, &v)], true);
    assert!(
        text.contains(&format!(
            "✗ image archive /nonexistent/cache/sandbox.tar (image_archive from {}) does not exist\n    fix: run `scripts/setup-debian.sh --configure`",
            sys.display()
        )),
        "{text}"
    );

    // Another file: edit it.
    std::fs::write(&sys, "image_archive = \"/nonexistent/mine.tar\"\n").unwrap();
    let text = doctor(&home, &[(k, &v)], true);
    assert!(
        text.contains(&format!("fix: edit `image_archive` in {}", sys.display())),
        "{text}"
    );

    // The environment: name the variable.
    let text = doctor(
        &home,
        &[(
            "MCP_BRIDGE_IMAGE_ARCHIVE",
            OsStr::new("/nonexistent/env.tar"),
        )],
        true,
    );
    assert!(
        text.contains(
            "✗ image archive /nonexistent/env.tar (image_archive from environment variable MCP_BRIDGE_IMAGE_ARCHIVE) does not exist\n    fix: unset MCP_BRIDGE_IMAGE_ARCHIVE, or set it"
        ),
        "{text}"
    );

    // An archive that is there but is not what its digest says; `--quick` does not hash it.
    let archive = home.path().join("sandbox.tar");
    std::fs::write(&archive, b"not the archive the digest is of").unwrap();
    let actual = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read(&archive).unwrap()))
    };
    std::fs::write(
        &sys,
        format!(
            "# Written by mcp-code-bridge's scripts/setup-debian.sh --configure.\n\
             image_archive = \"{}\"\nimage_sha256 = \"{}\"\n",
            archive.display(),
            "1".repeat(64)
        ),
    )
    .unwrap();
    let text = doctor(&home, &[(k, &v)], false);
    assert!(
        text.contains(&format!(
            "✗ image archive {} has sha256 {actual}, but image_sha256 (from {}) expects {}\n    fix: run `scripts/setup-debian.sh --configure`",
            archive.display(),
            sys.display(),
            "1".repeat(64)
        )),
        "{text}"
    );
    let text = doctor(&home, &[(k, &v)], true);
    assert!(text.contains("sha256 not checked with --quick"), "{text}");
    assert!(!text.contains("✗ image archive"), "{text}");

    // The right digest, from the environment this time.
    let text = doctor(
        &home,
        &[(k, &v), ("MCP_BRIDGE_IMAGE_SHA256", OsStr::new(&actual))],
        false,
    );
    assert!(
        text.contains(&format!(
            "✓ image archive {} (0 MiB, from {}) matches its sha256",
            archive.display(),
            sys.display()
        )),
        "{text}"
    );
}

#[test]
fn an_unknown_variable_is_a_warning_naming_the_closest_key() {
    let home = Home::new();
    let text = config_output(home.command().env("MCP_BRIDGE_TIMOUT", "5"));
    assert!(
        text.contains(
            "# warning: MCP_BRIDGE_TIMOUT is not a setting and is ignored; did you mean MCP_BRIDGE_TIMEOUT?"
        ),
        "{text}"
    );
    let out = home
        .command()
        .env("MCP_BRIDGE_MEM", "1g")
        .arg("servers")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("WARN")
            && err.contains("MCP_BRIDGE_MEM is not a setting")
            && err.contains("MCP_BRIDGE_MEMORY?"),
        "{err}"
    );
}

/// `exec` and `doctor` print for a person: without a log level chosen, no INFO line of the log
/// joins their output; a chosen one is honoured.
#[test]
fn exec_and_doctor_log_only_warnings_unless_a_level_is_chosen() {
    let home = Home::new();
    let info_lines = |out: &std::process::Output| -> Vec<String> {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.contains(" INFO "))
            .map(String::from)
            .collect()
    };
    let run = |args: &[&str], level: Option<&str>| {
        let mut cmd = home.command();
        cmd.env_remove("MCP_BRIDGE_LOG_LEVEL").args(args);
        if let Some(l) = level {
            cmd.env("MCP_BRIDGE_LOG_LEVEL", l);
        }
        cmd.output().unwrap()
    };
    let out = run(&["exec", "print(1)"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(info_lines(&out), Vec::<String>::new());
    let out = run(&["exec", "print(1)"], Some("info"));
    assert!(!info_lines(&out).is_empty(), "a chosen level shows INFO");
    let out = run(&["doctor"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(info_lines(&out), Vec::<String>::new());
}

/// `doctor` checks the engine and then runs a sandbox on it: with no engine socket listening
/// (the harness's case), the bridge starts its own podman service for that, once.
#[test]
fn doctor_starts_the_podman_service_once() {
    let home = Home::new();
    let out = home.command().arg("doctor").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("sandbox runs: python"), "{stdout}");
    let starts = stderr
        .lines()
        .filter(|l| l.contains("starting the bridge's own `podman system service`"))
        .count();
    assert_eq!(starts, 1, "{stderr}");
}

/// A one-shot run has no session: its time-limit notice says how to raise `--timeout` and
/// nothing about sessions or the `"timeout"` argument of `run_python`.
#[test]
fn exec_timeout_notice_speaks_of_the_flag_not_a_session() {
    let home = Home::new();
    let out = home
        .command()
        .args(["--timeout", "1", "exec", "import time\ntime.sleep(30)"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    let notice = stderr
        .lines()
        .find(|l| l.contains("[bridge]"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(notice.contains("the time limit of 1s expired"), "{notice}");
    assert!(notice.contains("--timeout"), "{notice}");
    assert!(!notice.to_lowercase().contains("session"), "{notice}");
    assert!(!notice.contains("\"timeout\""), "{notice}");
}

/// What a client gets for input the bridge cannot use: a line that is not JSON is answered
/// `-32700`, JSON that is no request `-32600` (with its id when it has one), both logged, and
/// serving goes on (see `stdio`); `prompts/get`
/// names what the server implements; a timeout that is not positive is refused with what it
/// must be.
#[tokio::test(flavor = "multi_thread")]
async fn unusable_input_is_named_and_serving_goes_on() {
    use std::time::Duration;
    let mut b = common::RawBridge::start(Home::new(), &[]).await;
    b.send_line(b"hello, is this thing on?").await;
    let r = b.next(Duration::from_secs(10)).await.expect("an answer");
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert!(r["id"].is_null(), "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("not JSON") && msg.contains("one JSON-RPC message"),
        "{r}"
    );
    b.send_json(json!({"jsonrpc": "2.0", "id": 9, "params": {}}))
        .await;
    let r = b.response(9, Duration::from_secs(10)).await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    b.send_json(
        json!({"jsonrpc": "2.0", "id": 1, "method": "prompts/get", "params": {"name": "x"}}),
    )
    .await;
    let r = b.response(1, Duration::from_secs(10)).await;
    assert_eq!(r["error"]["code"], -32601, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("prompts/get") && msg.contains("tools/call"),
        "{msg}"
    );
    for (id, timeout) in [(2, json!(-1)), (3, json!(0)), (4, json!("5"))] {
        b.send_json(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "run_python", "arguments": {"code": "1", "timeout": timeout}}}))
            .await;
        let r = b.response(id, Duration::from_secs(10)).await;
        assert_eq!(r["error"]["code"], -32602, "{r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains("timeout"), "{r}");
        if id != 4 {
            assert!(msg.contains("must be a positive number of seconds"), "{r}");
        }
    }
    b.send_json(json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}))
        .await;
    let r = b.response(5, Duration::from_secs(10)).await;
    assert_eq!(r["result"]["tools"][0]["name"], "run_python");
    // This client speaks a revision before 2026-07-28: no caching hints (SEP-2549) are sent.
    assert!(
        r["result"].get("ttlMs").is_none() && r["result"].get("cacheScope").is_none(),
        "{r}"
    );
    let log = b.home.log();
    assert!(
        log.contains("stdin: Parse error: the line is not JSON"),
        "{log}"
    );
    // Error replies are one readable line each, not rmcp's Debug dump of the error.
    assert!(
        log.contains("prompts/get: answered with error -32601"),
        "{log}"
    );
    assert!(!log.contains("response error"), "{log}");
    b.close_stdin();
    assert!(b.wait_exit(Duration::from_secs(30)).await.is_some());
}
