//! The console over HTTP, on every backend: each page and what it shows, each action and
//! what it changed in the database, and the refusals, which change nothing.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use http_body_util::BodyExt;
use outbox_core::admin::{Admin, Catalog, DeadLetterFilter, PauseTarget};
use outbox_core::{Category, MessageId, ScopeId};
use outbox_testkit::StoreBackend;
use outbox_testkit::fixtures::{OrgUpdate, ProjectUpdate, Recorder, note, org_shard};
use outbox_testkit::memory::MemoryBackend;
use outbox_testkit::mysql::MySqlBackend;
use outbox_testkit::postgres::PgBackend;
use outbox_testkit::sqlite::SqliteBackend;
use outbox_web::ConsoleOptions;
use tower::ServiceExt;

const TOKEN: &str = "a-console-token-for-the-tests-42";

/// The names of the test fixtures' scopes and categories.
fn catalog() -> Catalog {
    Catalog::of(&Recorder::new().registry())
}

/// A browser of the console: its cookie and its session's form token once logged in.
struct Browser {
    app: Router,
    cookie: Option<String>,
    csrf: Option<String>,
}

/// A response: its status, headers and page.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    page: String,
}

impl Answer {
    fn location(&self) -> &str {
        self.headers
            .get(header::LOCATION)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
    }
}

impl Browser {
    fn new(app: Router) -> Self {
        Self {
            app,
            cookie: None,
            csrf: None,
        }
    }

    async fn send(&self, request: Request<Body>) -> Answer {
        let response = self.app.clone().oneshot(request).await.expect("a response");
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.expect("a body").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            page: String::from_utf8(bytes.to_vec()).expect("UTF-8"),
        }
    }

    async fn get(&self, path: &str) -> Answer {
        let mut request = Request::get(path);
        if let Some(cookie) = &self.cookie {
            request = request.header(header::COOKIE, cookie);
        }
        self.send(request.body(Body::empty()).unwrap()).await
    }

    /// Posts a form with `fields`, and the session's form token if logged in.
    async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Answer {
        let mut form = form_urlencoded::Serializer::new(String::new());
        if let Some(csrf) = &self.csrf {
            form.append_pair("csrf", csrf);
        }
        for (name, value) in fields {
            form.append_pair(name, value);
        }
        self.post_raw(path, form.finish(), None).await
    }

    async fn post_raw(&self, path: &str, body: String, bearer: Option<&str>) -> Answer {
        let mut request =
            Request::post(path).header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(cookie) = &self.cookie {
            request = request.header(header::COOKIE, cookie);
        }
        if let Some(token) = bearer {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        self.send(request.body(Body::from(body)).unwrap()).await
    }

    /// Logs in with `token`; the session's cookie and form token are kept.
    async fn log_in(&mut self, token: &str) -> Answer {
        let answer = self
            .post(
                "/login",
                &[("operator", "ada"), ("token", token), ("next", "/pauses")],
            )
            .await;
        if let Some(cookie) = answer.headers.get(header::SET_COOKIE) {
            let cookie = cookie.to_str().unwrap();
            self.cookie = Some(cookie.split(';').next().unwrap().to_owned());
            let page = self.get("/pauses").await.page;
            let marker = "name=\"csrf\" value=\"";
            let start = page.find(marker).expect("a form token") + marker.len();
            self.csrf = Some(page[start..start + 64].to_owned());
        }
        answer
    }
}

fn console<B: StoreBackend>(backend: &B, options: ConsoleOptions) -> Router {
    outbox_web::router(Arc::new(backend.store()), options.catalog(catalog()))
}

/// How many dead letters `store` holds.
async fn dead_letters<S: Admin>(store: &S) -> usize {
    store
        .dead_letters(&DeadLetterFilter::all())
        .await
        .expect("the dead letters")
        .len()
}

fn with_actions() -> ConsoleOptions {
    ConsoleOptions::with_actions(TOKEN).expect("a long token")
}

/// Two shards with pending messages, and a dead letter set aside from a third.
async fn outbox<B: StoreBackend>() -> (B, Vec<MessageId>) {
    let backend = B::create().await;
    let ids = backend
        .write(&[
            note::<OrgUpdate>(1, 1, 1),
            note::<OrgUpdate>(1, 2, 2),
            note::<OrgUpdate>(2, 3, 3),
            note::<OrgUpdate>(3, 4, 4),
        ])
        .await
        .expect("written");
    backend
        .store()
        .set_aside(ids[3], "the handler refused it: no such project")
        .await
        .expect("set aside");
    (backend, ids)
}

async fn pages_show_the_outbox<B: StoreBackend>() {
    let (backend, ids) = outbox::<B>().await;
    let browser = Browser::new(console(&backend, ConsoleOptions::read_only()));

    let overview = browser.get("/").await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.page);
    for shown in [
        "Pending",
        "Dead letters",
        "Shards by state",
        "organization:1",
        "read-only",
    ] {
        assert!(
            overview.page.contains(shown),
            "the overview shows {shown}: {}",
            overview.page
        );
    }
    assert!(
        overview.page.contains("data-live"),
        "the overview refreshes itself"
    );

    let shards = browser.get("/shards").await;
    assert_eq!(shards.status, StatusCode::OK);
    assert!(shards.page.contains("organization:1") && shards.page.contains("organization:2"));
    assert!(
        !shards.page.contains("organization:3"),
        "the dead letter's shard is empty"
    );
    let scoped = browser.get("/shards?scope=user").await;
    assert!(scoped.page.contains("No shard matches"), "{}", scoped.page);
    let scoped = browser.get("/shards?scope=organization").await;
    assert!(
        scoped.page.contains("organization:1") && scoped.page.contains("organization:2"),
        "{}",
        scoped.page
    );
    let of_category = browser
        .get(&format!("/shards?category={}", OrgUpdate::NAME))
        .await;
    assert!(
        of_category.page.contains("organization:1") && of_category.page.contains("organization:2"),
        "{}",
        of_category.page
    );
    let of_category = browser
        .get(&format!("/shards?category={}", ProjectUpdate::NAME))
        .await;
    assert!(
        of_category.page.contains("No shard matches"),
        "{}",
        of_category.page
    );
    let unknown = browser.get("/shards?category=no_such_category").await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST, "{}", unknown.page);
    assert!(
        unknown.page.contains("no_such_category"),
        "{}",
        unknown.page
    );

    let shard = browser.get("/shard?key=organization%3A1").await;
    assert_eq!(shard.status, StatusCode::OK, "{}", shard.page);
    assert!(
        shard.page.contains("&quot;seq&quot;: 1"),
        "the payload, pretty: {}",
        shard.page
    );
    assert!(shard.page.contains(&format!("Message {}", ids[1].0)));
    assert!(
        !shard.page.contains("Retry now"),
        "no action in a read-only console"
    );

    let letters = browser.get("/dead-letters?category=org_update").await;
    assert_eq!(letters.status, StatusCode::OK);
    assert!(
        letters.page.contains(&format!("?id={}", ids[3].0)),
        "{}",
        letters.page
    );
    let none = browser.get("/dead-letters?older_than=1day").await;
    assert!(
        none.page.contains("No dead letter matches"),
        "{}",
        none.page
    );

    let letter = browser.get(&format!("/dead-letter?id={}", ids[3].0)).await;
    assert_eq!(letter.status, StatusCode::OK);
    assert!(
        letter.page.contains("no such project"),
        "its error: {}",
        letter.page
    );

    for path in [
        "/pauses",
        "/backfills",
        "/assets/console.css",
        "/assets/console.js",
    ] {
        assert_eq!(browser.get(path).await.status, StatusCode::OK, "{path}");
    }
}

async fn actions_change_the_outbox<B: StoreBackend>() {
    let (backend, ids) = outbox::<B>().await;
    let store = backend.store();
    let mut browser = Browser::new(console(&backend, with_actions()));
    let login = browser.log_in(TOKEN).await;
    assert_eq!(login.status, StatusCode::SEE_OTHER, "{}", login.page);
    assert_eq!(
        login.location(),
        "/pauses",
        "back where the login was asked for"
    );
    let set_cookie = login.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"));

    let shard_page = browser.get("/shard?key=organization%3A1").await;
    assert!(shard_page.page.contains("Retry now") && shard_page.page.contains("Logged in as"));

    let paused = browser
        .post(
            "/shard/pause",
            &[("shard", "organization:1"), ("reason", "incident 42")],
        )
        .await;
    assert_eq!(paused.status, StatusCode::SEE_OTHER, "{}", paused.page);
    let pauses = store.pauses().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(pauses[0].target, PauseTarget::Shard(org_shard(1)));
    assert_eq!(pauses[0].reason.as_deref(), Some("incident 42"));
    let after = browser.get(paused.location()).await;
    assert!(
        after.page.contains("Paused shard organization:1"),
        "the notice: {}",
        after.page
    );
    browser
        .post("/shard/resume", &[("shard", "organization:1")])
        .await;
    assert!(store.pauses().await.unwrap().is_empty());

    let retried = browser
        .post("/shard/retry", &[("shard", "organization:2")])
        .await;
    assert_eq!(retried.status, StatusCode::SEE_OTHER);
    assert!(
        retried.location().contains("not+backing+off"),
        "{}",
        retried.location()
    );

    browser
        .post(
            "/pauses",
            &[
                ("kind", "scope"),
                ("what", "organization"),
                ("reason", "deploy"),
            ],
        )
        .await;
    assert_eq!(
        store.pauses().await.unwrap()[0].target,
        PauseTarget::Scope(ScopeId(1))
    );
    let listed = browser.get("/pauses").await;
    assert!(listed.page.contains("deploy"), "{}", listed.page);
    browser
        .post(
            "/pauses/remove",
            &[("kind", "scope"), ("what", "organization")],
        )
        .await;
    assert!(store.pauses().await.unwrap().is_empty());

    let letter = ids[3].0.to_string();
    let preview = browser
        .post(
            "/dead-letters/preview",
            &[("action", "replay"), ("id", &letter)],
        )
        .await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.page);
    assert!(
        preview.page.contains("Replay 1 letter of 1 shard?"),
        "{}",
        preview.page
    );
    assert_eq!(dead_letters(&store).await, 1, "a preview changes nothing");
    let replayed = browser
        .post(
            "/dead-letters/confirm",
            &[("action", "replay"), ("id", &letter)],
        )
        .await;
    assert_eq!(replayed.status, StatusCode::SEE_OTHER, "{}", replayed.page);
    assert!(dead_letters(&store).await == 0);
    let pending = store.pending_messages(10).await.unwrap();
    assert_eq!(pending.len(), 4, "back in the outbox: {pending:?}");
    assert!(pending.iter().any(|message| message.shard == org_shard(3)));

    store.set_aside(ids[0], "refused again").await.unwrap();
    let purge = [("action", "purge"), ("id", &*ids[0].0.to_string())];
    let preview = browser.post("/dead-letters/preview", &purge).await;
    assert!(
        preview.page.contains("Purge 1 letter of 1 shard?"),
        "{}",
        preview.page
    );
    let purged = browser.post("/dead-letters/confirm", &purge).await;
    assert_eq!(purged.status, StatusCode::SEE_OTHER, "{}", purged.page);
    assert!(dead_letters(&store).await == 0);

    // A script acts with the token as a bearer header, without a session.
    let scripted = Browser::new(console(&backend, with_actions()));
    let answer = scripted
        .post_raw(
            "/pauses",
            "kind=shard&what=organization%3A2".to_owned(),
            Some(TOKEN),
        )
        .await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.page);
    assert_eq!(
        store.pauses().await.unwrap()[0].target,
        PauseTarget::Shard(org_shard(2))
    );
}

async fn refusals_change_nothing<B: StoreBackend>() {
    let (backend, ids) = outbox::<B>().await;
    let store = backend.store();
    let letter = ids[3].0.to_string();

    let read_only = Browser::new(console(&backend, ConsoleOptions::read_only()));
    let refused = read_only
        .post_raw(
            "/shard/pause",
            "shard=organization%3A1".to_owned(),
            Some(TOKEN),
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.page.contains("read-only"), "{}", refused.page);
    assert_eq!(read_only.get("/login").await.status, StatusCode::FORBIDDEN);

    let mut browser = Browser::new(console(&backend, with_actions()));
    let anonymous = browser
        .post("/shard/pause", &[("shard", "organization:1")])
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let wrong = browser
        .post_raw(
            "/shard/pause",
            "shard=organization%3A1".to_owned(),
            Some("not-the-token"),
        )
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let bad_login = browser.log_in("not-the-console-token").await;
    assert_eq!(bad_login.status, StatusCode::UNAUTHORIZED);
    assert!(bad_login.headers.get(header::SET_COOKIE).is_none());

    browser.log_in(TOKEN).await;
    let csrf = browser.csrf.take();
    let forged = browser
        .post("/shard/pause", &[("shard", "organization:1")])
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "no form token");
    browser.csrf = Some("f".repeat(64));
    let forged = browser
        .post("/shard/pause", &[("shard", "organization:1")])
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "another form token");
    browser.csrf = csrf;
    assert!(store.pauses().await.unwrap().is_empty());

    for (path, fields, status, says) in [
        (
            "/shard/pause",
            vec![("shard", "organization")],
            StatusCode::BAD_REQUEST,
            "SCOPE:IDENTIFIER",
        ),
        (
            "/shard/pause",
            vec![("shard", "nowhere:1")],
            StatusCode::BAD_REQUEST,
            "unknown scope",
        ),
        (
            "/pauses",
            vec![("kind", "planet"), ("what", "1")],
            StatusCode::BAD_REQUEST,
            "a shard, a category or a scope",
        ),
        (
            "/dead-letters/preview",
            vec![("action", "replay"), ("id", "999999")],
            StatusCode::NOT_FOUND,
            "999999",
        ),
        (
            "/dead-letters/preview",
            vec![("action", "replay"), ("id", "twelve")],
            StatusCode::BAD_REQUEST,
            "not a message id",
        ),
        (
            "/dead-letters/preview",
            vec![("action", "burn"), ("id", &letter)],
            StatusCode::BAD_REQUEST,
            "replay or purge",
        ),
        (
            "/dead-letters/preview",
            vec![("action", "replay")],
            StatusCode::BAD_REQUEST,
            "no dead letter selected",
        ),
        (
            "/backfills",
            vec![("model", "org_update"), ("version", "x")],
            StatusCode::BAD_REQUEST,
            "not a version",
        ),
    ] {
        let answer = browser.post(path, &fields).await;
        assert_eq!(answer.status, status, "{path} {fields:?}: {}", answer.page);
        assert!(
            answer.page.contains(says),
            "{path} {fields:?} says {says}: {}",
            answer.page
        );
        assert!(answer.page.contains("Nothing changed") || status == StatusCode::NOT_FOUND);
    }
    assert!(store.pauses().await.unwrap().is_empty());
    assert_eq!(
        browser.get("/shard?key=organization%3A77").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        browser.get("/dead-letter?id=999999").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        browser.get("/shards?filter=sideways").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        browser.get("/no-such-page").await.status,
        StatusCode::NOT_FOUND
    );

    // A confirmation of letters one of which is gone meanwhile changes nothing.
    store.set_aside(ids[0], "refused").await.unwrap();
    let both = [
        ("action", "purge"),
        ("id", &*letter),
        ("id", &*ids[0].0.to_string()),
    ];
    let preview = browser.post("/dead-letters/preview", &both).await;
    assert!(
        preview.page.contains("Purge 2 letters of 2 shards?"),
        "{}",
        preview.page
    );
    store.replay_dead_letters(&[ids[0]]).await.unwrap();
    let stale = browser.post("/dead-letters/confirm", &both).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.page);
    assert!(
        stale.page.contains("1 of the 2 previewed is no longer"),
        "{}",
        stale.page
    );
    assert_eq!(
        dead_letters(&store).await,
        1,
        "the other letter is still there"
    );
}

/// Nested in a service's router, the console's links and cookie follow its path.
async fn nested_links_follow_the_mount<B: StoreBackend>() {
    let (backend, _) = outbox::<B>().await;
    let app = Router::new().nest("/ops/outbox", console(&backend, with_actions()));
    let mut browser = Browser::new(app);
    let overview = browser.get("/ops/outbox").await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.page);
    assert!(
        overview.page.contains("href=\"/ops/outbox/shards\""),
        "{}",
        overview.page
    );
    assert!(overview.page.contains("/ops/outbox/assets/console.css"));
    let login = browser
        .post(
            "/ops/outbox/login",
            &[
                ("operator", "ada"),
                ("token", TOKEN),
                ("next", "//evil.example"),
            ],
        )
        .await;
    assert_eq!(login.location(), "/ops/outbox", "never to another site");
    let cookie = login.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("Path=/ops/outbox"), "{cookie}");
    assert!(
        !cookie.contains("Secure"),
        "served over plain HTTP by default: {cookie}"
    );

    // Served over TLS, the cookie goes over HTTPS only.
    let app = console(&backend, with_actions().secure_cookies());
    let login = Browser::new(app)
        .post("/login", &[("operator", "ada"), ("token", TOKEN)])
        .await;
    let cookie = login.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("; Secure"), "{cookie}");
    browser.cookie = None;
}

/// Above the backlog a store counts exactly, the overview shows its estimates (as the relays'
/// gauges read them, at a cost that does not grow with the backlog) and ranks no shard.
async fn a_large_backlog_is_estimated<B>()
where
    B: StoreBackend<Store = outbox_sqlx::SqlxStore<<B as Dialected>::Dialect>> + Dialected,
{
    let (backend, _) = outbox::<B>().await;
    let counted = Browser::new(console(&backend, ConsoleOptions::read_only()));
    let page = counted.get("/").await.page;
    assert!(
        !page.contains("(estimated)") && page.contains("Deepest shards"),
        "{page}"
    );
    assert!(
        page.contains("organization:1"),
        "the deepest shards listed: {page}"
    );

    let store = backend.store().exact_gauges_up_to(1);
    let app = outbox_web::router(
        Arc::new(store),
        ConsoleOptions::read_only().catalog(catalog()),
    );
    let estimating = Browser::new(app);
    let page = estimating.get("/").await.page;
    assert!(page.contains("(estimated)"), "{page}");
    assert!(page.contains("too large to rank every shard"), "{page}");
    assert!(!page.contains("organization:1"), "no shard ranked: {page}");
    // The shards page ranks them from a sample, and says so.
    let page = estimating.get("/shards").await.page;
    assert!(
        page.contains("ranked from a sample of 3 pending messages"),
        "{page}"
    );
    assert!(
        page.contains("organization:1") && page.contains("≈ 2"),
        "shard 1's two messages, counted up to a cap of 1 and estimated beyond: {page}"
    );
    let page = counted.get("/shards").await.page;
    assert!(!page.contains("ranked from a sample"), "{page}");
}

/// The backends whose store is the shared sqlx body.
trait Dialected {
    type Dialect: outbox_sqlx::Dialect;
}

impl Dialected for SqliteBackend {
    type Dialect = outbox_sqlite::SqliteDialect;
}

impl Dialected for PgBackend {
    type Dialect = outbox_postgres::PgDialect;
}

impl Dialected for MySqlBackend {
    type Dialect = outbox_mysql::MySqlDialect;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_large_backlog_is_estimated() {
    a_large_backlog_is_estimated::<SqliteBackend>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_large_backlog_is_estimated() {
    a_large_backlog_is_estimated::<PgBackend>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_large_backlog_is_estimated() {
    a_large_backlog_is_estimated::<MySqlBackend>().await;
}

/// What the page shows after `label`: the text of the element that follows it, tags removed.
fn after_label(page: &str, label: &str) -> String {
    let at = page
        .find(&format!("<dt>{label}</dt>"))
        .unwrap_or_else(|| panic!("{label} in: {page}"));
    let rest = &page[at..];
    let start = rest.find("<dd>").expect("its value") + 4;
    let end = rest.find("</dd>").expect("its end");
    rest[start..end].to_owned()
}

/// A shard that failed and backs off shows when it is tried again; once a newer message makes
/// it due before that time (S19), its listing and its page say "now", as its state does, not
/// the retry time still ahead.
async fn a_shard_due_again_shows_no_wait<B: StoreBackend>() {
    use outbox_core::{Backoff, BoxError, Delivery, Registry, Relay, RelayConfig};
    use std::time::Duration;

    let backend = B::create().await;
    backend
        .write(&[note::<OrgUpdate>(1, 1, 1)])
        .await
        .expect("written");
    let failing = Registry::builder()
        .handle::<OrgUpdate>(|_: Delivery<OrgUpdate>| async {
            Err::<(), BoxError>("the receiver said 503".into())
        })
        .build()
        .expect("a registry");
    let hour = Duration::from_secs(3600);
    let config = RelayConfig::builder()
        .backoff(Backoff::new(hour, hour).with_jitter(false))
        .build()
        .expect("a configuration");
    Relay::with_config(backend.store(), failing, config)
        .drain()
        .await
        .expect("the drain");
    let browser = Browser::new(console(&backend, ConsoleOptions::read_only()));
    let shard = browser.get("/shard?key=organization%3A1").await;
    assert!(
        after_label(&shard.page, "State").contains("backing off"),
        "{}",
        shard.page
    );
    let waiting = after_label(&shard.page, "Next retry");
    assert!(waiting.starts_with("in "), "{waiting}");

    backend
        .write(&[note::<OrgUpdate>(1, 2, 2)])
        .await
        .expect("a newer message");
    let shard = browser.get("/shard?key=organization%3A1").await;
    assert!(
        after_label(&shard.page, "State").contains("due"),
        "{}",
        shard.page
    );
    assert_eq!(after_label(&shard.page, "Next retry"), "now");
    let shards = browser.get("/shards").await;
    let row = shards
        .page
        .split("<tr>")
        .find(|row| row.contains("organization:1"))
        .expect("the shard's row");
    assert!(
        row.contains("<td>now</td>") && !row.contains("<td>in "),
        "{row}"
    );
}

macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test::<super::MemoryBackend>().await; })*
        }
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test::<super::SqliteBackend>().await; })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test::<super::PgBackend>().await; })*
        }
        mod mariadb {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test::<super::MySqlBackend>().await; })*
        }
    };
}

on_every_backend!(
    pages_show_the_outbox,
    actions_change_the_outbox,
    refusals_change_nothing,
    nested_links_follow_the_mount,
    a_shard_due_again_shows_no_wait,
);
