//! The `outbox` command: see the crate's documentation (`outbox_cli`).

fn main() -> std::process::ExitCode {
    outbox_cli::main()
}
