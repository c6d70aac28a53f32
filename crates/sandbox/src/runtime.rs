//! The sandbox's Python runtime as the bridge ships it: the modules of `image/runtime/`,
//! embedded from one list, and the boot frame that carries them to the loader with the bridge's
//! constants the runtime works with (docs/protocol.md, "Boot"). Each constant is written once,
//! here on the host, and the runtime takes it from the frame.

use std::sync::LazyLock;

use bridge_core::protocol::{self, HostFrame, RuntimeCode, RuntimeConstants};

/// `(name, source)` of the module `image/runtime/<name>.py`.
macro_rules! module {
    ($name:literal) => {
        (
            $name,
            include_str!(concat!("../../../image/runtime/", $name, ".py")),
        )
    };
}

/// The runtime's modules, `(name, source)`: every file of `image/runtime/`, once. The loader
/// compiles a module when it is first imported, so their order does not matter.
pub(crate) const MODULES: &[(&str, &str)] = &[
    module!("api"),
    module!("boot"),
    module!("channel"),
    module!("constants"),
    module!("discovery"),
    module!("display"),
    module!("execute"),
    module!("installs"),
    module!("interrupts"),
    module!("notebook"),
    module!("outdir"),
    module!("output"),
    module!("package"),
    module!("proxies"),
    module!("rpc"),
    module!("seccomp"),
    module!("skills"),
    module!("snapshot"),
    module!("state"),
    module!("values"),
];

/// The module whose `main` the loader calls.
pub(crate) const ENTRY: &str = "boot";

/// What the runtime takes from the host rather than writing itself.
fn constants() -> RuntimeConstants<'static> {
    RuntimeConstants {
        max_frame_bytes: protocol::MAX_FRAME_BYTES,
        max_image_bytes: super::images::MAX_IMAGE_BYTES,
        out_dir: super::files::OUT_DIR,
        out_entries: super::files::MAX_ENTRIES,
        kept_dir: super::files::KEPT_DIR,
        skill_default_depth: protocol::SKILL_DEFAULT_DEPTH,
    }
}

/// The boot frame, the first line every container reads, without compiled code: the runtime
/// itself, the same bytes for every sandbox, so made once.
pub(crate) fn boot_line() -> &'static [u8] {
    static LINE: LazyLock<Vec<u8>> = LazyLock::new(|| boot_line_with(None));
    &LINE
}

/// The boot frame carrying `code`, the modules' compiled code a sandbox sent
/// (`super::compiled`).
pub(crate) fn boot_line_with(code: Option<&RuntimeCode>) -> Vec<u8> {
    HostFrame::Boot {
        modules: MODULES,
        entry: ENTRY,
        constants: constants(),
        code,
    }
    .to_line()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    fn runtime_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../image/runtime")
    }

    /// A module added to `image/runtime/` and not to `MODULES` would never reach a sandbox.
    #[test]
    fn every_module_of_image_runtime_is_listed_once() {
        let files: BTreeSet<String> = std::fs::read_dir(runtime_dir())
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                name.strip_suffix(".py").map(str::to_string)
            })
            .collect();
        let names: Vec<&str> = MODULES.iter().map(|(n, _)| *n).collect();
        let listed: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
        assert_eq!(
            listed.len(),
            names.len(),
            "a module listed twice: {names:?}"
        );
        assert_eq!(
            listed, files,
            "MODULES and the files of image/runtime/ differ"
        );
        assert!(names.contains(&ENTRY));
    }

    #[test]
    fn the_boot_frame_carries_every_module_and_the_hosts_constants() {
        let line = boot_line();
        assert_eq!(line.last(), Some(&b'\n'));
        let frame: serde_json::Value = serde_json::from_slice(line).unwrap();
        assert_eq!(frame["type"], "boot");
        assert_eq!(frame["entry"], ENTRY);
        let modules = frame["modules"].as_object().unwrap();
        assert_eq!(modules.len(), MODULES.len());
        for (name, source) in MODULES {
            assert_eq!(modules[*name], *source);
        }
        let c = &frame["constants"];
        assert_eq!(c["max_frame_bytes"], protocol::MAX_FRAME_BYTES);
        assert_eq!(c["max_image_bytes"], super::super::images::MAX_IMAGE_BYTES);
        assert_eq!(c["out_dir"], super::super::files::OUT_DIR);
        assert_eq!(c["out_entries"], super::super::files::MAX_ENTRIES);
        assert_eq!(c["kept_dir"], super::super::files::KEPT_DIR);
        assert_eq!(c["skill_default_depth"], protocol::SKILL_DEFAULT_DEPTH);
    }

    /// The runtime names the constants it takes in `FROM_HOST` (image/runtime/constants.py) and
    /// refuses to start without any of them: the frame sends exactly those.
    #[test]
    fn the_constants_sent_are_the_ones_the_runtime_takes() {
        let source = MODULES.iter().find(|(n, _)| *n == "constants").unwrap().1;
        let table = source
            .split("FROM_HOST = {")
            .nth(1)
            .and_then(|rest| rest.split('}').next())
            .expect("FROM_HOST in constants.py");
        let taken: BTreeSet<&str> = table
            .lines()
            .filter_map(|l| l.trim().strip_prefix('"')?.split('"').next())
            .collect();
        let frame: serde_json::Value = serde_json::from_slice(boot_line()).unwrap();
        let sent: BTreeSet<&str> = frame["constants"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(sent, taken);
    }
}
