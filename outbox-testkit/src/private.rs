//! What `#[outbox_testkit::test]` expands to calls, through `::outbox_testkit::__private`.
//! Not public API.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use crate::database::TestDatabase;

/// The runtime a test runs on: `flavor = "multi_thread"` (the default) or
/// `flavor = "current_thread"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// A multi-threaded runtime, with a worker per core.
    MultiThread,
    /// A runtime on the test's thread alone.
    CurrentThread,
}

/// The attribute's options.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The runtime.
    pub flavor: Flavor,
    /// Whether the database gets the outbox migrations (`migrations = false`: an empty one).
    pub migrations: bool,
}

/// Runs `test` on a new runtime with a new database of type `D`; the database is dropped
/// (a PostgreSQL one with `DROP DATABASE`, a SQLite file removed) when the test returns or
/// panics, and a panic is then passed on as the test's failure.
pub fn run<D, T, F>(options: Options, test: T) -> F::Output
where
    D: TestDatabase,
    T: FnOnce(D) -> F,
    F: Future,
{
    let mut builder = match options.flavor {
        Flavor::MultiThread => tokio::runtime::Builder::new_multi_thread(),
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = builder
        .enable_all()
        .build()
        .unwrap_or_else(|error| panic!("cannot build the test's tokio runtime: {error}"));
    let outcome = runtime.block_on(async move {
        let database = if options.migrations {
            D::migrated().await
        } else {
            D::create().await
        };
        // The test owns the database, dropped as the test's future ends: here, inside the
        // runtime (the pool's connections go back through tasks of this runtime), whether the
        // test returns or panics. A panic is caught so that the runtime, and the tasks the
        // test left behind, shut down as usual before it is passed on.
        AssertUnwindSafe(test(database)).catch_unwind().await
    });
    drop(runtime);
    match outcome {
        Ok(output) => output,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Compiles only when `D` is a test database: the attribute's check of the test's argument
/// where the `#[test]` function itself is not compiled (outside `cargo test`).
pub const fn assert_test_database<D: TestDatabase>() {}
