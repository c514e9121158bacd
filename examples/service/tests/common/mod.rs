//! The service's binary, run by the end-to-end tests.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The service, running; killed if the test fails before it stops it.
pub(crate) struct Service {
    child: Child,
    address: String,
}

impl Service {
    /// Starts the service on `database_url` and a free port, with `args` added.
    pub(crate) fn start(database_url: &str, args: &[&str]) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let address = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_service"))
            .env("DATABASE_URL", database_url)
            .args(["--listen", &address])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the service");
        Self { child, address }
    }

    /// One HTTP/1.1 request: the status code and the body.
    pub(crate) fn request(&self, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
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
        let (_, body) = response.split_once("\r\n\r\n")?;
        Some((status, body.to_owned()))
    }

    /// One HTTP/1.1 request: the status code and the JSON body (`null` if it is not JSON).
    pub(crate) fn request_json(
        &self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Option<(u16, Value)> {
        let (status, body) = self.request(method, path, body)?;
        Some((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
    }

    /// Polls `path` until it answers `status`, failing after 30 s.
    pub(crate) async fn wait_for(&self, path: &str, status: u16) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.request_json("GET", path, "") {
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
    pub(crate) async fn terminate(mut self) -> (ExitStatus, Duration) {
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
