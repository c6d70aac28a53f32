use std::process::ExitCode;

use clap::Parser;

use mcp_code_bridge::cli::{self, Cli};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A keeper of a parked sandbox needs no configuration and no async runtime.
    if matches!(cli.command, Some(cli::Command::KeepParked { .. })) {
        return mcp_code_bridge::sandbox::park::keeper_main();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return cli::fail(
                &cli::Usage::new(format!("cannot start the async runtime: {e}")),
                2,
            );
        }
    };
    let code = runtime.block_on(cli::main(cli));
    // Background tasks (idle reapers, pipes) must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    code
}
