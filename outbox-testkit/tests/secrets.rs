//! No password reaches an error's message, its debug form, or a log line (S27), on every path
//! of the library that is given a URL or a driver's text about one: connecting to PostgreSQL,
//! MariaDB and SQLite, TLS asked of a server, the test kit's provision, and each sink's and consumer's
//! connection (NATS, Redis, RabbitMQ, Kafka), down to what a failed delivery stores for the
//! console. Each URL holds the password in every form the drivers accept
//! ([`outbox_testkit::secrets::urls`]).
//!
//! The command and the console it serves are proven in `outbox-cli`'s `tests/secrets.rs` and
//! `tests/ui.rs`, with the same URLs.

use std::process::Command;
use std::time::Duration;

use outbox_core::Relay;
use outbox_core::admin::Admin;
use outbox_core::inbox::Consumer;
use outbox_core::sink::Sink;
use outbox_core::store::Store as _;
use outbox_testkit::StoreBackend;
use outbox_testkit::brokers;
use outbox_testkit::consumers::{self, Database};
use outbox_testkit::secrets::{Logs, SECRETS, assert_hidden, shown, urls};
use outbox_testkit::sqlite::SqliteBackend;

/// Where nothing listens.
const NOWHERE: &str = "127.0.0.1:1";
/// A port that is not a number.
const NOT_A_PORT: &str = "127.0.0.1:notaport";

/// Checks that what the whole process logged so far holds no password.
#[track_caller]
fn assert_logs_hidden(logs: &Logs) {
    assert_hidden("a log line", &logs.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_postgresql_never_shows_the_password() {
    let logs = Logs::capture();
    let mut fed = Vec::new();
    for host in [NOWHERE, NOT_A_PORT, "127.0.0.1:5432"] {
        fed.extend(urls("postgres", "postgres", host, "/outbox_no_such_db", ""));
        fed.extend(urls(
            "postgresql",
            "postgres",
            host,
            "/postgres",
            "sslmode=bogus",
        ));
    }
    // TLS asked of a server, with a root certificate that is not there.
    fed.extend(urls(
        "postgres",
        "postgres",
        "127.0.0.1:5432",
        "/postgres",
        "sslmode=verify-full&sslrootcert=/nonexistent/root.crt",
    ));
    for url in &fed {
        let error = outbox_postgres::connect(url)
            .await
            .expect_err("no database, no port or no such sslmode");
        assert_hidden(url, &shown(&error));
    }
    // Accepted (the local server trusts its clients) and then failing on a missing schema.
    for url in urls("postgres", "postgres", "127.0.0.1:5432", "/postgres", "") {
        let Ok(pool) = outbox_postgres::connect(&url).await else {
            continue;
        };
        let store = outbox_postgres::PgStore::new(pool);
        if let Err(error) = store.check_schema().await {
            assert_hidden(&url, &shown(&error));
        }
    }
    assert_logs_hidden(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_mariadb_never_shows_the_password() {
    let logs = Logs::capture();
    let mut fed = Vec::new();
    for host in [NOWHERE, NOT_A_PORT, "127.0.0.1:3306"] {
        // The local root has no password: one given is refused.
        fed.extend(urls("mysql", "root", host, "/test", ""));
        fed.extend(urls("mariadb", "root", host, "/test", "ssl-mode=bogus"));
    }
    fed.extend(urls(
        "mysql",
        "root",
        "127.0.0.1:3306",
        "/test",
        "ssl-mode=verify_identity&ssl-ca=/nonexistent/ca.pem",
    ));
    for url in &fed {
        let error = outbox_mysql::connect(url)
            .await
            .expect_err("a password refused, no port or no such ssl-mode");
        assert_hidden(url, &shown(&error));
    }
    assert_logs_hidden(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_sqlite_never_shows_the_password() {
    let logs = Logs::capture();
    let dir = tempfile::tempdir().expect("a directory");
    let missing = format!("{}/no/such/dir/outbox.db", dir.path().display());
    // SQLite reads no password: each form is refused, or opens nothing.
    let mut fed = urls("sqlite", "outbox", "", &missing, "");
    fed.extend(urls("sqlite", "outbox", "", &missing, "mode=bogus"));
    // Another database's URL, given where a SQLite file goes.
    fed.extend(urls("postgres", "postgres", NOWHERE, "/postgres", ""));
    fed.extend(urls("mysql", "root", NOWHERE, "/test", ""));
    for url in &fed {
        let error = outbox_sqlite::connect(std::path::Path::new(url))
            .await
            .expect_err("no such directory, mode or scheme");
        assert_hidden(url, &shown(&error));
    }
    assert_logs_hidden(&logs);
}

/// The test kit's provision, run in a child of this test binary with `DATABASE_URL` and
/// `MYSQL_URL` naming a server that cannot be reached: it fails saying how to provide one,
/// and nothing it prints holds the password.
#[test]
fn provisioning_a_test_database_never_shows_the_password() {
    let this = std::env::current_exe().expect("this test binary");
    let servers = [
        ("DATABASE_URL", "provision_postgres", "postgres", "postgres"),
        // The test kit's MariaDB databases come with its `mysql` feature (on in a run of the
        // whole workspace).
        #[cfg(feature = "mysql")]
        ("MYSQL_URL", "provision_mariadb", "mysql", "root"),
    ];
    for (variable, child, scheme, user) in servers {
        for host in [NOWHERE, NOT_A_PORT] {
            for url in urls(scheme, user, host, "/test", "") {
                let output = Command::new(&this)
                    .args([child, "--exact", "--ignored", "--nocapture"])
                    .env(variable, &url)
                    .output()
                    .expect("run the child");
                let printed = format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
                assert_hidden(&url, &printed);
                // A URL the provision takes fails, saying what it tried; one it does not
                // (written without `//`) falls back to the local server and passes.
                if url.contains("://") {
                    assert!(!output.status.success(), "{url} provisioned:\n{printed}");
                    assert!(
                        printed.contains("need a server") || printed.contains("is not a"),
                        "{url} failed otherwise:\n{printed}"
                    );
                }
            }
        }
    }
}

/// A child of [`provisioning_a_test_database_never_shows_the_password`].
#[tokio::test]
#[ignore = "run by provisioning_a_test_database_never_shows_the_password"]
async fn provision_postgres() {
    outbox_testkit::postgres::PgTestDatabase::create().await;
}

/// A child of [`provisioning_a_test_database_never_shows_the_password`].
#[cfg(feature = "mysql")]
#[tokio::test]
#[ignore = "run by provisioning_a_test_database_never_shows_the_password"]
async fn provision_mariadb() {
    outbox_testkit::mysql::MySqlTestDatabase::create().await;
}

/// billing's consumer (the test kit's) on `database`, for a broker's consumer to apply through.
fn billing_consumer(database: &Database) -> Consumer {
    consumers::billing_consumer(
        outbox_sqlite::SqliteStore::new(database.pool().clone()),
        consumers::Charge::default(),
    )
}

/// Relays one audit event through `sink`, which cannot reach its broker: what the drain
/// reports and what the store keeps for the console (the shard's last error), as shown.
async fn failed_delivery_through(sink: impl Sink) -> String {
    let backend = SqliteBackend::create().await;
    let relay = Relay::with_config(
        backend.store(),
        brokers::registry(sink),
        brokers::relay_config("secrets"),
    );
    backend.write(&brokers::events(1, 1)).await.expect("write");
    let report = relay.drain().await.expect("drain");
    // Failed, or parked behind the sink's open breaker.
    assert_eq!(
        report.failures.len() + report.unavailable.len(),
        1,
        "{report:?}"
    );
    let states = backend.store().shard_states().await.expect("shard states");
    let failures: Vec<String> = report
        .failures
        .iter()
        .map(|failure| shown(&failure.error))
        .collect();
    format!("{failures:?}\n{report:?}\n{states:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_never_shows_the_password() {
    let logs = Logs::capture();
    for url in urls("nats", "outbox", NOWHERE, "", "") {
        let client = match outbox_nats::connect(
            &url,
            async_nats::ConnectOptions::new().retry_on_initial_connect(),
        )
        .await
        {
            Ok(client) => client,
            Err(error) => {
                assert_hidden(&url, &shown(&error));
                continue;
            }
        };
        let sink = outbox_nats::NatsSink::new(client).with_ack_timeout(Duration::from_millis(200));
        assert_hidden(&url, &format!("{sink:?}"));
        assert_hidden(&url, &failed_delivery_through(sink).await);
    }
    // Connected (the local server asks for no credentials), then consuming a stream that
    // is not there.
    let billing = consumers::billing_database().await;
    let consumer = outbox_nats::NatsConsumer::new(
        billing_consumer(&billing),
        "outbox_test_no_such_stream",
        "billing",
    );
    for url in urls("nats", "outbox", "127.0.0.1:4222", "", "") {
        match outbox_nats::connect(&url, async_nats::ConnectOptions::new()).await {
            Ok(client) => {
                let error = consumer
                    .run(client, std::future::pending())
                    .await
                    .expect_err("no such stream");
                assert_hidden(&url, &shown(&error));
            }
            Err(error) => assert_hidden(&url, &shown(&error)),
        }
    }
    assert_logs_hidden(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_never_shows_the_password() {
    let logs = Logs::capture();
    let mut fed = urls("redis", "outbox", NOWHERE, "/0", "");
    fed.extend(urls("redis", "outbox", "127.0.0.1:6379", "/0", ""));
    let billing = consumers::billing_database().await;
    let consumer = outbox_redis::RedisConsumer::new(
        billing_consumer(&billing),
        "outbox_test_secrets",
        "billing",
        "secrets",
    );
    for url in &fed {
        let client = match redis::Client::open(url.as_str()) {
            Ok(client) => client,
            Err(error) => {
                assert_hidden(url, &shown(&error));
                continue;
            }
        };
        assert_hidden(url, &format!("{client:?}"));
        match outbox_redis::RedisSink::connect(client.clone()).await {
            Ok(sink) => assert_hidden(url, &format!("{sink:?}")),
            Err(error) => assert_hidden(url, &shown(&error)),
        }
        let stop = tokio::time::sleep(Duration::from_millis(100));
        if let Err(error) = consumer.run(client, stop).await {
            assert_hidden(url, &shown(&error));
        }
    }
    assert_logs_hidden(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_never_shows_the_password() {
    let logs = Logs::capture();
    let mut fed = Vec::new();
    for host in [NOWHERE, NOT_A_PORT, "127.0.0.1:5672"] {
        // The broker refuses the guest with another password.
        fed.extend(urls("amqp", "guest", host, "/%2f", ""));
        fed.extend(urls("amqp", "guest", host, "/%ff", "heartbeat=soon"));
    }
    fed.extend(urls("amqps", "guest", NOWHERE, "/%2f", ""));
    let billing = consumers::billing_database().await;
    let consumer = outbox_rabbitmq::RabbitConsumer::new(
        billing_consumer(&billing),
        "outbox_test_no_such_queue",
    );
    for url in &fed {
        let error = outbox_rabbitmq::RabbitSink::connect(url.clone())
            .await
            .expect_err("the sink cannot connect");
        assert_hidden(url, &shown(&error));
        let error = consumer
            .run(url, std::future::pending())
            .await
            .expect_err("the consumer cannot connect");
        assert_hidden(url, &shown(&error));
    }
    assert_logs_hidden(&logs);
}

/// Kafka takes no URL: its password is a client setting (`sasl.password`), shown nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_never_shows_the_password() {
    let logs = Logs::capture();
    let billing = consumers::billing_database().await;
    for password in ["hunter2", "hun@ter2"] {
        let mut config = rdkafka::ClientConfig::new();
        config
            .set("bootstrap.servers", NOWHERE)
            .set("security.protocol", "sasl_plaintext")
            .set("sasl.mechanisms", "PLAIN")
            .set("sasl.username", "outbox")
            .set("sasl.password", password)
            .set("message.timeout.ms", "300");
        let consumer = outbox_kafka::KafkaConsumer::new(
            billing_consumer(&billing),
            config.clone(),
            "outbox.audit_event",
            "billing",
        );
        assert_hidden(password, &format!("{consumer:?}"));
        let stop = tokio::time::sleep(Duration::from_millis(300));
        if let Err(error) = consumer.run(stop).await {
            assert_hidden(password, &shown(&error));
        }
        match outbox_kafka::KafkaSink::with_config(config) {
            Ok(sink) => {
                assert_hidden(password, &format!("{sink:?}"));
                assert_hidden(password, &failed_delivery_through(sink).await);
            }
            Err(error) => assert_hidden(password, &shown(&error)),
        }
    }
    assert_logs_hidden(&logs);
}

/// The check itself: a password in any of its forms is caught.
#[test]
fn every_form_of_the_password_is_caught() {
    for secret in SECRETS {
        let caught = std::panic::catch_unwind(|| assert_hidden("a URL", &format!("x {secret} y")));
        assert!(caught.is_err(), "{secret} passed");
    }
    assert_hidden("a URL", "postgres://app:***@db/app");
}
