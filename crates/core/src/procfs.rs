//! What `/proc/<pid>/stat` says about a process: whether it still runs, and since when. Both
//! the upstream pool (is a stdio server's child alive?) and the sandbox (is the bridge that owns
//! a container alive?) ask, and both must read the file the same way: the command name in field
//! 2 may contain spaces and parentheses, so fields are counted after its last `)`. Also the
//! host's available memory (`mem_available`), which the sandbox keeps a reserve of.

/// Field 3 (the state) and field 22 (the start time, in clock ticks after boot) of a process,
/// `None` when there is no such process.
fn stat(pid: u32) -> Option<(String, Option<u64>)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    let mut fields = after_name.split_whitespace();
    let state = fields.next().unwrap_or("").to_string();
    let start = fields.nth(18).and_then(|s| s.parse().ok());
    Some((state, start))
}

/// A zombie (exited, not yet reaped by its parent) or dead process has stopped for our purposes.
fn stopped(state: &str) -> bool {
    state.starts_with('Z') || state.starts_with('X')
}

/// Whether `pid` is a live process (not gone, not a zombie waiting to be reaped).
pub fn is_running(pid: u32) -> bool {
    stat(pid).is_some_and(|(state, _)| !stopped(&state))
}

/// The start time of `pid` while it runs, `None` when it is gone or a zombie. With the pid it
/// names one process across pid reuse.
pub fn running_since(pid: u32) -> Option<u64> {
    let (state, start) = stat(pid)?;
    if stopped(&state) { None } else { start }
}

/// The host's available memory in bytes (`MemAvailable` of `/proc/meminfo`: what can be had
/// without swapping), `None` where there is no such file or line.
pub fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_available_memory_is_read() {
        let avail = mem_available().expect("MemAvailable in /proc/meminfo");
        assert!(avail > 0);
    }

    #[test]
    fn this_process_runs_and_a_reaped_child_does_not() {
        let me = std::process::id();
        assert!(is_running(me));
        assert!(running_since(me).is_some_and(|t| t > 0));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!is_running(pid));
        assert_eq!(running_since(pid), None);
    }

    #[test]
    fn a_zombie_is_not_running() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not waited for: it stays a zombie until `child` is reaped.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while is_running(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!is_running(pid));
        assert_eq!(running_since(pid), None);
        child.wait().unwrap();
    }
}
