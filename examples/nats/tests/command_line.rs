//! The example's programs as a user runs them: `--help` prints their usage and does nothing
//! else, and two runs of the publisher in a row both get their orders into the stream (against
//! the local NATS server, JetStream on 127.0.0.1:4222, on a stream of its own that it deletes).

use std::collections::BTreeSet;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nats_orders::{Target, consume};

/// The local NATS server the tests publish to.
const NATS_URL: &str = "nats://127.0.0.1:4222";

/// Runs `program` with `args` (and `NATS_URL` set to `nats_url`), failing the test if it has
/// not exited within `within`: its output.
async fn run(program: &str, args: &[&str], nats_url: &str, within: Duration) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .env("NATS_URL", nats_url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("start {program}: {error}"));
    let deadline = Instant::now() + within;
    while child.try_wait().expect("poll the child").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("the killed child's output");
            panic!(
                "{program} {args:?} did not exit within {within:?}:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.wait_with_output().expect("the child's output")
}

/// A stream of the test's own.
fn target(test: &str) -> Target {
    Target {
        url: NATS_URL.to_owned(),
        stream: format!("outbox_example_{test}_{}", std::process::id()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_prints_the_usage_and_publishes_nothing() {
    let target = target("help");
    let publisher = env!("CARGO_BIN_EXE_publisher");
    let consumer = env!("CARGO_BIN_EXE_consumer");
    // A URL with a password, in the environment: `--help` must not show it.
    let secret_url = "nats://shop:hunter2@127.0.0.1:4222";
    for (program, args) in [
        (publisher, vec!["--help"]),
        (
            publisher,
            vec!["--orders", "3", "--stream", &target.stream, "--help"],
        ),
        (publisher, vec!["-h"]),
        (consumer, vec!["--help"]),
    ] {
        let output = run(program, &args, secret_url, Duration::from_secs(10)).await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{program} {args:?}: {:?}\n{stdout}{stderr}",
            output.status
        );
        assert!(stdout.contains("Usage:"), "{program} {args:?}:\n{stdout}");
        assert!(stdout.contains("--stream"), "{program} {args:?}:\n{stdout}");
        assert!(
            !stdout.contains("hunter2") && !stderr.contains("hunter2"),
            "{program} {args:?} shows NATS_URL's password:\n{stdout}{stderr}"
        );
        assert!(
            !stdout.contains("wrote orders"),
            "{program} {args:?} published:\n{stdout}"
        );
    }
    let help = run(publisher, &["--help"], NATS_URL, Duration::from_secs(10)).await;
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("--orders"),
        "{help:?}"
    );

    // Nothing reached NATS: the stream named with `--help` was not even created.
    let client = async_nats::connect(NATS_URL)
        .await
        .expect("connect to NATS");
    let jetstream = async_nats::jetstream::new(client);
    assert!(
        jetstream.get_stream(&target.stream).await.is_err(),
        "`publisher --stream {} --help` created the stream",
        target.stream
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_of_the_publisher_in_a_row_both_get_their_orders_stored() {
    let target = target("twice");
    let publisher = env!("CARGO_BIN_EXE_publisher");
    let args = [
        "--orders",
        "5",
        "--customers",
        "2",
        "--stream",
        &target.stream,
    ];
    for run_number in 1..=2 {
        let output = run(publisher, &args, NATS_URL, Duration::from_secs(60)).await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "run {run_number}: {:?}\n{stdout}{stderr}",
            output.status
        );
        assert!(
            stdout.starts_with("wrote orders ")
                && stdout.contains("JetStream acknowledged 5 of their 5 messages")
                && stdout.contains("stored 5 new messages"),
            "run {run_number}:\n{stdout}{stderr}"
        );
    }

    let received = consume(&target, Duration::from_secs(2), |_| {})
        .await
        .expect("consume the orders");
    let orders: BTreeSet<i64> = received.iter().map(|one| one.order.order).collect();
    let keys: BTreeSet<&str> = received.iter().map(|one| one.message_id.as_str()).collect();
    assert_eq!(received.len(), 10, "{received:#?}");
    assert_eq!(
        orders.len(),
        10,
        "order ids unique across runs: {received:#?}"
    );
    assert_eq!(
        keys.len(),
        10,
        "message ids unique across runs: {received:#?}"
    );
    let (first_run, second_run) = received.split_at(5);
    assert!(
        first_run.iter().all(|one| second_run
            .iter()
            .all(|two| one.order.order < two.order.order)),
        "the second run numbers its orders after the first's: {received:#?}"
    );
    target
        .delete_stream()
        .await
        .expect("delete the test's stream");
}
