//! The binary: everything is in the library (`cli::entry`), so this crate compiles in seconds.

fn main() -> std::process::ExitCode {
    mcp_code_bridge::cli::entry()
}
