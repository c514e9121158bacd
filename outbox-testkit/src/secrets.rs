//! Proof that no password reaches what a program shows (S27): URLs holding one in every form the
//! drivers accept, a check of what was shown, and a capture of every log line.
//!
//! Feed each URL of [`urls`] to the path under test (a connect, a sink, a command), then pass
//! what it showed (the error's [`shown`] form, a page, the [`Logs`]) to [`assert_hidden`]:
//!
//! ```
//! use outbox_testkit::secrets::{assert_hidden, shown, urls};
//!
//! for url in urls("postgres", "app", "db:notaport", "/app", "") {
//!     let error = outbox_core::Error::invalid_database_url(&url, "the port is not a number");
//!     assert_hidden(&url, &shown(&error));
//! }
//! ```

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// The password the URLs of [`urls`] hold, in each form it is written there and decoded:
/// none of these may be shown.
pub const SECRETS: &[&str] = &["hunter2", "hunt%65r2", "hun%40ter2", "hun@ter2"];

/// URLs of `scheme` to `host` (`host:port`) and `path` (`/database`, or empty) as `user`, each
/// holding a password in one of the forms drivers accept: in the user-info (as is,
/// percent-encoded, with an encoded `@`), as a `password` parameter (its name as is and
/// percent-encoded), behind a stray `?` (`?sslmode=require?password=…`, which reads as one
/// parameter), as a key's passphrase (`sslpassword`), and in the user-info of a URL written without `//`. `parameters`
/// (`sslmode=require`, or empty) are added to each.
pub fn urls(scheme: &str, user: &str, host: &str, path: &str, parameters: &str) -> Vec<String> {
    let query = |secret: &str| match (parameters.is_empty(), secret.is_empty()) {
        (true, true) => String::new(),
        (true, false) => format!("?{secret}"),
        (false, true) => format!("?{parameters}"),
        (false, false) => format!("?{parameters}&{secret}"),
    };
    let stray = if parameters.is_empty() {
        "?application=outbox?password=hunter2".to_owned()
    } else {
        format!("?{parameters}?password=hunter2")
    };
    vec![
        format!("{scheme}://{user}:hunter2@{host}{path}{}", query("")),
        format!("{scheme}://{user}:hunt%65r2@{host}{path}{}", query("")),
        format!("{scheme}://{user}:hun%40ter2@{host}{path}{}", query("")),
        format!(
            "{scheme}://{user}@{host}{path}{}",
            query("password=hunter2")
        ),
        format!(
            "{scheme}://{user}@{host}{path}{}",
            query("pass%77ord=hunter2")
        ),
        format!("{scheme}://{user}@{host}{path}{stray}"),
        format!(
            "{scheme}://{user}@{host}{path}{}",
            query("sslpassword=hunter2")
        ),
        format!("{scheme}:{user}:hunter2@{host}{path}{}", query("")),
    ]
}

/// An error as it can be shown: its message with every cause ([`outbox_core::error::error_chain`]),
/// then its debug form.
pub fn shown(error: &(dyn std::error::Error + 'static)) -> String {
    format!("{}\n{error:?}", outbox_core::error::error_chain(error))
}

/// Panics, naming `what` was fed (a URL) and what was shown, if `shown` holds any of
/// [`SECRETS`].
#[track_caller]
pub fn assert_hidden(what: &str, shown: &str) {
    if let Some(secret) = SECRETS.iter().find(|secret| shown.contains(*secret)) {
        panic!("{what} showed its password ({secret}):\n{shown}");
    }
}

/// Every log line of this process from the moment [`Logs::capture`] is first called: each
/// `tracing` event at every level (with its span's fields), and each record of the `log`
/// crate (librdkafka's, lapin's dependencies'), as text.
#[derive(Debug, Clone)]
pub struct Logs {
    text: Arc<Mutex<Vec<u8>>>,
}

impl Logs {
    /// Installs the capture as this process's `tracing` subscriber and `log` logger, once;
    /// later calls return the same capture.
    ///
    /// # Panics
    ///
    /// If another subscriber or logger was installed for the whole process first: the lines
    /// would go there, unseen.
    pub fn capture() -> Self {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs {
                text: Arc::default(),
            };
            let writer = logs.clone();
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .try_init()
                .expect("no other tracing subscriber for the whole process");
            log::set_boxed_logger(Box::new(logs.clone()))
                .expect("no other logger for the whole process");
            log::set_max_level(log::LevelFilter::Trace);
            logs
        })
        .clone()
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        let text = self.text.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&text).into_owned()
    }

    /// Adds `bytes` to what was logged.
    fn append(&self, bytes: &[u8]) {
        self.text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
    }
}

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.append(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl log::Log for Logs {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let line = format!(
            "{} {}: {}\n",
            record.level(),
            record.target(),
            record.args()
        );
        self.append(line.as_bytes());
    }

    fn flush(&self) {}
}
