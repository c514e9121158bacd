//! The console in a real browser (headless Chromium, driven through ChromeDriver): an operator
//! opens the overview, follows a failing shard, replays a dead letter and sees the handler
//! receive it, pauses and resumes a scope, and walks the main flow with the keyboard alone.
//! Each test saves a screenshot under the tests' output directory
//! (`target/tmp/console-screenshots`).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`/usr/bin/chromium`,
//! `/usr/bin/chromedriver`); CI installs them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

#[path = "browser/webdriver.rs"]
mod webdriver;

use outbox_core::admin::{Admin, Catalog, DeadLetterFilter, PauseTarget};
use outbox_core::relay::RelayConfig;
use outbox_core::{MessageId, Registry, Relay, ScopeId};
use outbox_testkit::StoreBackend;
use outbox_testkit::fixtures::{OrgUpdate, Recorder, note};
use outbox_testkit::sqlite::SqliteBackend;
use outbox_web::ConsoleOptions;
use webdriver::{Client, Key, Locator};

const TOKEN: &str = "a-console-token-for-the-browser";
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A ChromeDriver of this test's own, stopped at the end.
struct Driver {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free local port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

/// Starts ChromeDriver and a headless Chromium session with a fresh profile.
async fn browser() -> (Driver, Client) {
    for program in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            std::path::Path::new(program).exists(),
            "{program} is missing: install Debian's chromium and chromium-driver \
             (apt-get install chromium chromium-driver)"
        );
    }
    let port = free_port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let profile = tempfile::tempdir().expect("a profile directory");
    let driver = Driver {
        child,
        port,
        _profile: profile,
    };
    let capabilities = serde_json::json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                "--disable-quic", "--window-size=1280,900",
                format!("--user-data-dir={}", driver._profile.path().display()),
            ],
        },
    });
    let url = format!("http://127.0.0.1:{}", driver.port);
    let mut attempts = 0;
    let client = loop {
        match Client::connect(&url, capabilities.clone()).await {
            Ok(client) => break client,
            Err(error) if attempts < 50 => {
                attempts += 1;
                let _ = error;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("cannot start a Chromium session: {error}"),
        }
    };
    (driver, client)
}

/// Serves the console of `backend` on a free local port; returns its address.
async fn serve<B: StoreBackend>(backend: &B, options: ConsoleOptions) -> SocketAddr {
    let catalog = Catalog::of(&Recorder::new().registry());
    let app = outbox_web::router(Arc::new(backend.store()), options.catalog(catalog));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a local port");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

/// Saves a screenshot of the page as `name.png` under the tests' output directory.
async fn screenshot(client: &Client, name: &str) -> PathBuf {
    let directory = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&directory).expect("the screenshots' directory");
    let path = directory.join(format!("{name}.png"));
    let png = client.screenshot().await.expect("a screenshot");
    std::fs::write(&path, png).expect("the screenshot saved");
    path
}

/// Logs in through the form with the console's token.
async fn log_in(client: &Client, base: &str) {
    client
        .goto(&format!("{base}/login"))
        .await
        .expect("the login page");
    type_into(client, Locator::Id("operator"), "the name field", "ada").await;
    let token = client
        .find(Locator::Id("token"))
        .await
        .expect("the token field");
    token.send_keys(TOKEN).await.expect("typed");
    token
        .send_keys(&Key::Enter.to_string())
        .await
        .expect("submitted");
    wait_for_text(client, "Logged in as").await;
}

/// Clicks the element `locator` finds (`what`, for the failure).
async fn click(client: &Client, locator: Locator<'_>, what: &str) {
    client
        .find(locator)
        .await
        .unwrap_or_else(|error| panic!("{what}: {error}"))
        .click()
        .await
        .unwrap_or_else(|error| panic!("clicking {what}: {error}"));
}

/// Types `text` into the element `locator` finds (`what`, for the failure).
async fn type_into(client: &Client, locator: Locator<'_>, what: &str, text: &str) {
    client
        .find(locator)
        .await
        .unwrap_or_else(|error| panic!("{what}: {error}"))
        .send_keys(text)
        .await
        .unwrap_or_else(|error| panic!("typing into {what}: {error}"));
}

/// Waits until the page's text holds `text` (up to 10 s).
async fn wait_for_text(client: &Client, text: &str) -> String {
    for _ in 0..100 {
        let body = client.source().await.expect("the page");
        if body.contains(text) {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the page never showed {text:?}: {}",
        client.source().await.unwrap_or_default()
    );
}

/// A shard whose head fails (backing off, its error recorded), a healthy shard drained, and a
/// dead letter; the dead letter's id.
async fn incident(backend: &SqliteBackend) -> MessageId {
    let ids = backend
        .write(&[
            note::<OrgUpdate>(1, 1, 1),
            note::<OrgUpdate>(2, 2, 2),
            note::<OrgUpdate>(3, 3, 3),
        ])
        .await
        .expect("written");
    backend
        .store()
        .set_aside(ids[2], "the project no longer exists")
        .await
        .expect("set aside");
    let recorder = Recorder::new();
    let failing = outbox_testkit::faults::Faulty::fail_always()
        .when(|call| call.object_identifier == outbox_core::Id::from(1_i64));
    let registry: Registry = recorder
        .builder_with::<OrgUpdate>(failing)
        .build()
        .expect("a registry");
    let relay = Relay::with_config(backend.store(), registry, relay_config("incident"));
    relay.drain().await.expect("drained");
    ids[2]
}

fn relay_config(worker: &str) -> RelayConfig {
    RelayConfig::builder()
        .worker_id(worker.to_owned())
        .poll_interval(Duration::from_millis(50))
        .build()
        .expect("a relay configuration")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_follows_a_failing_shard_and_replays_a_dead_letter() {
    let backend = SqliteBackend::create().await;
    let letter = incident(&backend).await;
    let address = serve(&backend, ConsoleOptions::with_actions(TOKEN).unwrap()).await;
    let base = format!("http://{address}");
    let (_driver, client) = browser().await;

    client.goto(&base).await.expect("the overview");
    wait_for_text(&client, "Shards by state").await;
    screenshot(&client, "overview").await;

    click(
        &client,
        Locator::LinkText("backing off"),
        "the backing-off shards' link",
    )
    .await;
    wait_for_text(&client, "organization:1").await;
    click(
        &client,
        Locator::LinkText("organization:1"),
        "the failing shard",
    )
    .await;
    let page = wait_for_text(&client, "Last error").await;
    assert!(page.contains("injected"), "the error chain: {page}");
    screenshot(&client, "failing-shard").await;

    // A relay runs beside the console; the handler receives what is replayed.
    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), relay_config("live"));
    let running = relay.clone();
    let run = tokio::spawn(async move { running.run(std::future::pending()).await });

    log_in(&client, &base).await;
    client
        .goto(&format!("{base}/dead-letters"))
        .await
        .expect("the dead letters");
    click(
        &client,
        Locator::Id(&format!("letter-{}", letter.0)),
        "the letter's box",
    )
    .await;
    click(
        &client,
        Locator::Css("button[value=replay]"),
        "the replay button",
    )
    .await;
    wait_for_text(&client, "Replay 1 letter of 1 shard?").await;
    screenshot(&client, "replay-preview").await;
    click(
        &client,
        Locator::Css("form.actions button[type=submit]"),
        "the confirmation",
    )
    .await;
    wait_for_text(&client, "Replayed 1 letter of 1 shard").await;
    screenshot(&client, "replayed").await;

    for _ in 0..100 {
        if recorder.seen().iter().any(|seen| seen.seq == 3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        recorder.seen().iter().any(|seen| seen.seq == 3),
        "the handler received the replayed letter: {:?}",
        recorder.seen()
    );
    assert!(
        backend
            .store()
            .dead_letters(&DeadLetterFilter::all())
            .await
            .unwrap()
            .is_empty()
    );
    run.abort();
    client.close().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_and_resumes_a_scope() {
    let backend = SqliteBackend::create().await;
    incident(&backend).await;
    let address = serve(&backend, ConsoleOptions::with_actions(TOKEN).unwrap()).await;
    let base = format!("http://{address}");
    let (_driver, client) = browser().await;
    log_in(&client, &base).await;

    client
        .goto(&format!("{base}/pauses"))
        .await
        .expect("the pauses");
    client
        .find(Locator::Css("select[name=kind]"))
        .await
        .expect("what to pause")
        .select_by_value("scope")
        .await
        .expect("a scope");
    type_into(
        &client,
        Locator::Css("input[name=what]"),
        "its name",
        "organization",
    )
    .await;
    type_into(
        &client,
        Locator::Css("input[name=reason]"),
        "the reason",
        "incident 42",
    )
    .await;
    click(
        &client,
        Locator::XPath("//button[text()='Pause']"),
        "the pause button",
    )
    .await;
    wait_for_text(&client, "Paused scope organization").await;
    screenshot(&client, "paused-scope").await;
    let store = backend.store();
    assert_eq!(
        store.pauses().await.unwrap()[0].target,
        PauseTarget::Scope(ScopeId(1))
    );

    click(
        &client,
        Locator::XPath("//button[text()='Resume']"),
        "the resume button",
    )
    .await;
    wait_for_text(&client, "Resumed scope organization.").await;
    assert!(store.pauses().await.unwrap().is_empty());
    client.close().await.ok();
}

/// Presses Tab until the focused element's text is `text` (at most 40 times); returns
/// whether it got there.
async fn tab_to(client: &Client, text: &str) -> bool {
    for _ in 0..40 {
        let active = client.active_element().await.expect("a focused element");
        if active.text().await.unwrap_or_default().trim() == text {
            return true;
        }
        active
            .send_keys(&Key::Tab.to_string())
            .await
            .expect("Tab pressed");
    }
    false
}

/// Presses Enter on the focused element.
async fn enter(client: &Client) {
    client
        .active_element()
        .await
        .expect("a focused element")
        .send_keys(&Key::Enter.to_string())
        .await
        .expect("Enter pressed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_flow_works_with_the_keyboard_alone() {
    let backend = SqliteBackend::create().await;
    incident(&backend).await;
    let address = serve(&backend, ConsoleOptions::with_actions(TOKEN).unwrap()).await;
    let base = format!("http://{address}");
    let (_driver, client) = browser().await;
    log_in(&client, &base).await;
    client.goto(&base).await.expect("the overview");
    wait_for_text(&client, "Shards by state").await;

    // The first Tab reaches the link that skips the navigation.
    type_into(
        &client,
        Locator::Css("body"),
        "the page",
        &Key::Tab.to_string(),
    )
    .await;
    assert!(
        tab_to(&client, "Skip to the content").await,
        "the skip link"
    );
    assert!(
        tab_to(&client, "Shards").await,
        "the navigation's Shards link"
    );
    enter(&client).await;
    wait_for_text(&client, "With pending messages").await;
    assert!(tab_to(&client, "organization:1").await, "a shard's link");
    enter(&client).await;
    wait_for_text(&client, "Pending messages").await;
    assert!(tab_to(&client, "Pause").await, "the pause button");
    enter(&client).await;
    let page = wait_for_text(&client, "Paused shard").await;
    assert!(page.contains("Resume"), "{page}");
    screenshot(&client, "keyboard-paused-shard").await;
    assert_eq!(backend.store().pauses().await.unwrap().len(), 1);
    client.close().await.ok();
}
