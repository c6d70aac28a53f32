//! `mcp-code-bridge serve` as the tests run it: the real binary on a loopback port the kernel
//! picks (`--listen 127.0.0.1:0`), its log in the home's `bridge.log`, its address read from
//! the line that says where it serves; and rmcp's real Streamable HTTP client for it.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};

use super::{BIN, Home};

pub struct Served {
    pub child: Child,
    pub home: Home,
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    pub pid: u32,
}

impl Served {
    /// Start `serve` with the home's environment, `env` and `args` after `serve`; waits (up to
    /// 60 s) for it to say where it serves.
    pub fn start(home: Home, env: &[(&str, &str)], args: &[&str]) -> Served {
        Served::start_with_open_files(home, env, args, None)
    }

    /// [`Served::start`] with the soft limit of open files set to `soft` (as systemd's 1024
    /// would be) before `serve` runs.
    pub fn start_with_open_files(
        home: Home,
        env: &[(&str, &str)],
        args: &[&str],
        soft: Option<u64>,
    ) -> Served {
        let log = std::fs::File::create(home.path().join("bridge.log")).unwrap();
        let mut all = home.env();
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut command = Command::new(BIN);
        command.arg("serve");
        if !args.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        if let Some(soft) = soft {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    let mut l = libc::rlimit {
                        rlim_cur: 0,
                        rlim_max: 0,
                    };
                    libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
                    l.rlim_cur = soft as libc::rlim_t;
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command
            .args(args)
            .env_clear()
            .envs(all)
            .current_dir(home.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn serve");
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(60);
        let url = loop {
            let text = home.log();
            if let Some(i) = text.find("serving MCP at ") {
                let rest = &text[i + "serving MCP at ".len()..];
                let end = rest.find([';', ' ', '\n']).unwrap_or(rest.len());
                break rest[..end].to_string();
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("serve exited ({status}) before serving; log:\n{text}");
            }
            assert!(
                Instant::now() < deadline,
                "serve did not start within 60 s; log:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        Served {
            child,
            home,
            url,
            pid,
        }
    }

    /// `scheme://host:port` of the server.
    pub fn base(&self) -> String {
        self.url.trim_end_matches("/mcp").to_string()
    }

    /// An MCP client of the server (rmcp's Streamable HTTP client), with `token` as its bearer.
    pub async fn client(&self, token: Option<&str>) -> RunningService<RoleClient, ()> {
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.url.as_str());
        if let Some(t) = token {
            config = config.auth_header(t);
        }
        let transport = StreamableHttpClientTransport::from_config(config);
        ().serve(transport)
            .await
            .unwrap_or_else(|e| panic!("MCP initialize over HTTP: {e}\nlog:\n{}", self.home.log()))
    }

    /// SIGTERM, then its exit status (within `within`).
    pub fn terminate(&mut self, within: Duration) -> Option<ExitStatus> {
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
