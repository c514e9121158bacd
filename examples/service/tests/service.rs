//! The example service end to end: the built binary on a fresh PostgreSQL database, probed,
//! given an order, stopped with SIGTERM; and its probes while the database is gone.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use outbox_testkit::postgres::PgTestDatabase;
use serde_json::Value;

/// The service, running; killed if the test fails before it stops it.
struct Service {
    child: Child,
    address: String,
}

impl Service {
    fn start(database_url: &str) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let address = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_service"))
            .env("DATABASE_URL", database_url)
            .args(["--listen", &address])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the service");
        Self { child, address }
    }

    /// One HTTP/1.1 request: the status code and the JSON body.
    fn request(&self, method: &str, path: &str, body: &str) -> Option<(u16, Value)> {
        let mut stream = TcpStream::connect(&self.address).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .ok()?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.address,
            body.len()
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let status = response.split_whitespace().nth(1)?.parse().ok()?;
        let json = response
            .split_once("\r\n\r\n")
            .and_then(|(_, body)| serde_json::from_str(body).ok())
            .unwrap_or(Value::Null);
        Some((status, json))
    }

    /// Polls `path` until it answers `status`, failing after 30 s.
    async fn wait_for(&self, path: &str, status: u16) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.request("GET", path, "") {
                Some((answered, body)) if answered == status => return body,
                _ => {}
            }
            assert!(
                Instant::now() < deadline,
                "{path} did not answer {status} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends SIGTERM; the exit status, within 15 s.
    async fn terminate(mut self) -> (ExitStatus, Duration) {
        let sent = Instant::now();
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(killed.success());
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the service") {
                return (status, sent.elapsed());
            }
            assert!(
                sent.elapsed() < Duration::from_secs(15),
                "the service did not stop within 15 s of SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn serves_probes_delivers_orders_and_stops_on_sigterm() {
    let database = PgTestDatabase::create().await;
    let service = Service::start(&database.url());
    let ready = service.wait_for("/readyz", 200).await;
    assert_eq!(ready["ready"], true, "{ready}");

    let (status, created) = service
        .request("POST", "/orders", r#"{"total_cents": 1250}"#)
        .expect("POST /orders");
    assert_eq!(status, 201, "{created}");
    let order = created["id"].as_i64().expect("the order's id");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shipped: Option<(i64,)> =
            sqlx::query_as("SELECT total_cents FROM shipments WHERE order_id = $1")
                .bind(order)
                .fetch_optional(database.pool())
                .await
                .expect("read shipments");
        if let Some((total,)) = shipped {
            assert_eq!(total, 1250);
            break;
        }
        assert!(Instant::now() < deadline, "the order was not shipped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let live = service.wait_for("/healthz", 200).await;
    assert!(live["last_ack_at"].is_number(), "{live}");

    let (status, took) = service.terminate().await;
    assert!(status.success(), "exits 0 on SIGTERM: {status:?}");
    assert!(took < Duration::from_secs(10), "stopped in {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_its_database_it_is_live_but_not_ready() {
    let database = PgTestDatabase::create().await;
    let service = Service::start(&database.url());
    service.wait_for("/readyz", 200).await;

    // The database goes away (dropped, its connections terminated).
    drop(database);
    let not_ready = service.wait_for("/readyz", 503).await;
    assert_eq!(not_ready["database_reachable"], false, "{not_ready}");
    let live = service.wait_for("/healthz", 200).await;
    assert_eq!(live["live"], true, "{live}");
    let (status, _) = service.terminate().await;
    assert!(status.success(), "exits 0 on SIGTERM: {status:?}");
}
