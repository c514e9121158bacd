//! The `outbox` command: see the crate's documentation (`outbox_cli`).

// The databases the installed command opens: each backend registers its URL schemes when it
// is linked (`outbox_core::admin::Backend`); the command itself names none.
use outbox_mysql as _;
use outbox_postgres as _;
use outbox_sqlite as _;

fn main() -> std::process::ExitCode {
    outbox_cli::main()
}
