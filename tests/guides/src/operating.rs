//! `docs/operating.md`: configuring the relay, the command in a service's binary.

use std::time::Duration;

use outbox::{BoxError, RelayConfig};

/// A relay that neither listens nor is told: it polls.
fn polling() -> Result<RelayConfig, BoxError> {
    let config = RelayConfig::builder()
        .listen_for_other_processes(false)          // no LISTEN
        .poll_interval(Duration::from_millis(250))  // the latency floor for other processes
        .build()?;
    Ok(config)
}

/// The command as a binary of the service's crate.
#[allow(unused_imports)] // the doc's `use` links a crate; this module is in it
pub mod command {
    use my_service as _; // links the crate whose declarations the command should know
    fn main() -> std::process::ExitCode {
        outbox::cli::main()
    }
}

/// The command as a subcommand of the service's own binary.
pub mod subcommand {
    fn serve() -> std::process::ExitCode {
        std::process::ExitCode::SUCCESS
    }

    fn main() -> std::process::ExitCode {
        let mut args = std::env::args_os();
        if let Some(command) = args.nth(1) && command == "outbox" {
            return outbox::cli::main_from(
                std::iter::once("my-service outbox".into()).chain(args),
                &outbox::admin::Catalog::discovered(),
            );
        }
        serve() // the service as usual
    }
}
