//! Connecting to NATS with the credentials of a URL kept out of the client's log.

use async_nats::{Client, ConnectOptions};

/// What [`connect`] refuses, or the client's own failure. Neither shows the URL's password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL does not read as NATS server addresses with their credentials.
    #[error("invalid NATS server URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, its password replaced ([`outbox_core::redact_url`]).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The client could not connect.
    #[error("cannot connect to NATS at {url}")]
    Connect {
        /// The servers, without their credentials.
        url: String,
        /// The client's error.
        #[source]
        source: async_nats::ConnectError,
    },
}

/// Connects to the NATS servers of `url` (`nats://user:password@host:4222`, a token as
/// `nats://token@host`; several servers separated by commas, those with credentials giving the
/// same) with `options`.
///
/// The credentials are handed to the client as options and the servers' addresses without
/// them: `async_nats` logs each address it tries (at `debug`, on every reconnection), and a
/// password left in one would reach the service's log. A URL with a query is refused (the
/// client reads none; a `?password=` there would be logged, not used).
///
/// ```no_run
/// # async fn example() -> Result<(), outbox_nats::ConnectError> {
/// let client = outbox_nats::connect(
///     "nats://orders:s3cret@nats-1:4222,nats://orders:s3cret@nats-2:4222",
///     async_nats::ConnectOptions::new().retry_on_initial_connect(),
/// )
/// .await?;
/// let sink = outbox_nats::NatsSink::new(client);
/// # let _ = sink;
/// # Ok(())
/// # }
/// ```
pub async fn connect(url: &str, options: ConnectOptions) -> Result<Client, ConnectError> {
    let (servers, credentials) = split(url)?;
    let options = match credentials {
        Credentials::None => options,
        Credentials::Token(token) => options.token(token),
        Credentials::User(user, password) => options.user_and_password(user, password),
    };
    let shown = servers.join(",");
    options
        .connect(servers.as_slice())
        .await
        .map_err(|source| ConnectError::Connect { url: shown, source })
}

/// The credentials a NATS URL's user-info holds, decoded.
#[derive(PartialEq, Eq)]
enum Credentials {
    None,
    Token(String),
    User(String, String),
}

/// `url`'s servers, each without its user-info, and the credentials they share.
fn split(url: &str) -> Result<(Vec<String>, Credentials), ConnectError> {
    let invalid = |reason: String| ConnectError::InvalidUrl {
        url: outbox_core::redact_url(url),
        reason: outbox_core::redact_url_in(&reason, url),
    };
    let mut servers = Vec::new();
    let mut shared: Option<Credentials> = None;
    for server in url.split(',').map(str::trim) {
        // As the client reads an address: `nats://` unless one is given.
        let written = if server.contains("://") {
            server.to_owned()
        } else {
            format!("nats://{server}")
        };
        let mut parsed = url::Url::parse(&written).map_err(|error| invalid(error.to_string()))?;
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(invalid(
                "a NATS server URL takes no parameters (a password goes in the user-info: \
                 nats://user:password@host)"
                    .to_owned(),
            ));
        }
        let decode = |text: &str| {
            percent_encoding::percent_decode_str(text)
                .decode_utf8()
                .map(std::borrow::Cow::into_owned)
                .map_err(|_| invalid("its user-info is not UTF-8 once decoded".to_owned()))
        };
        let credentials = match (parsed.username(), parsed.password()) {
            ("", None) => Credentials::None,
            (token, None) => Credentials::Token(decode(token)?),
            (user, Some(password)) => Credentials::User(decode(user)?, decode(password)?),
        };
        // A server written without credentials takes those of the others.
        match &shared {
            _ if credentials == Credentials::None => {}
            None => shared = Some(credentials),
            Some(first) if *first == credentials => {}
            Some(_) => {
                return Err(invalid(
                    "its servers have different credentials: give each the same".to_owned(),
                ));
            }
        }
        // A URL with a host takes any user-info.
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        servers.push(parsed.to_string());
    }
    Ok((servers, shared.unwrap_or(Credentials::None)))
}

#[cfg(test)]
mod tests {
    use super::{Credentials, split};

    #[test]
    fn credentials_leave_the_addresses() {
        let (servers, credentials) =
            split("nats://orders:hun%40ter2@a:4222, b:4223").expect("splits");
        assert_eq!(servers, ["nats://a:4222", "nats://b:4223"]);
        assert!(credentials == Credentials::User("orders".into(), "hun@ter2".into()));
        let (servers, credentials) = split("tls://s3cret@a").expect("splits");
        assert_eq!(servers, ["tls://a"]);
        assert!(credentials == Credentials::Token("s3cret".into()));
        let (_, credentials) = split("nats://a:4222").expect("splits");
        assert!(credentials == Credentials::None);
    }

    #[test]
    fn a_query_or_other_credentials_are_refused_without_the_password() {
        for url in [
            "nats://a:4222?password=hunter2",
            "nats://orders:hunter2@a:4222?x=y",
            "nats://orders:hunter2@a:4222,nats://orders:other@b:4222",
            "nats://orders:hunter2@a:notaport",
        ] {
            let error = split(url).err().expect("refused").to_string();
            assert!(!error.contains("hunter2"), "{error}");
        }
    }
}
