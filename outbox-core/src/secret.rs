//! Database URLs without their secrets, for every error, log line, `--help` text and page.
//!
//! sqlx takes a password in the user-info (`postgres://app:secret@db/app`), percent-encoded or
//! not, and as a query parameter (`?password=secret`, libpq's form; `sslpassword` for a
//! client key's passphrase). [`redact_url`] parses the URL with the `url` crate and replaces
//! each of them with `***`; a URL that does not parse shows only its scheme, since where its
//! secrets are cannot be known.

/// What a redacted secret reads as.
const HIDDEN: &str = "***";

/// `url` as it may be shown: its password and every secret query parameter replaced with
/// `***`. A string that does not parse as a URL shows its scheme and `…` only (`postgres://…`),
/// or `…` if it has none.
///
/// ```
/// use outbox_core::redact_url;
///
/// assert_eq!(redact_url("postgres://app:secret@db/app"), "postgres://app:***@db/app");
/// assert_eq!(
///     redact_url("postgres://app@db/app?password=secret&sslmode=require"),
///     "postgres://app@db/app?password=***&sslmode=require"
/// );
/// assert_eq!(redact_url("postgres://app:secret@db:notaport/app"), "postgres://…");
/// ```
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(parsed) => redact_parsed(parsed),
        Err(_) => match scheme(url) {
            Some(scheme) => format!("{scheme}://…"),
            None => "…".to_owned(),
        },
    }
}

fn redact_parsed(mut url: url::Url) -> String {
    if url.password().is_some() {
        // A URL with a password has a host: setting one cannot fail.
        let _ = url.set_password(Some(HIDDEN));
    }
    let secret_query = url
        .query_pairs()
        .any(|(key, value)| holds_secret(&key, &value));
    if secret_query {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(key, value)| {
                let value = if holds_secret(&key, &value) {
                    HIDDEN.to_owned()
                } else {
                    value.into_owned()
                };
                (key.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    let shown = url.to_string();
    // `scheme:user:password@host` or `scheme:/user:password@host` (no `//`) parses with all
    // of it as the path.
    match raw_password(&shown) {
        Some(password) if url.host().is_none() => shown.replacen(password, HIDDEN, 1),
        _ => shown,
    }
}

/// The password in `url`'s user-info as written, read off the text itself: for a URL that
/// does not parse, or that parses with no authority (`amqp:user:password@host`, with no `//`).
fn raw_password(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once(':')?;
    let rest = rest.trim_start_matches('/');
    let authority = rest.split(['/', '?', '#']).next()?;
    let (user_info, _) = authority.rsplit_once('@')?;
    let (_, password) = user_info.split_once(':')?;
    (!password.is_empty()).then_some(password)
}

/// The names of `url`'s query parameters that hold a secret (`password`, `sslpassword`,
/// any `…token`, `…secret`), as decoded, and of those whose value hides one behind a stray
/// `?` (`sslmode` in `?sslmode=require?password=…`, which a driver reads as one parameter);
/// none if `url` does not parse. A backend refuses those its driver does not read rather than
/// let the driver log them as unrecognized, value and all.
///
/// ```
/// use outbox_core::admin::secret_parameters;
///
/// assert_eq!(secret_parameters("postgres://db/app?sslpassword=x&sslmode=require"), ["sslpassword"]);
/// assert_eq!(secret_parameters("postgres://db/app?sslmode=require?password=x"), ["sslmode"]);
/// ```
pub fn secret_parameters(url: &str) -> Vec<String> {
    url::Url::parse(url).map_or_else(
        |_| Vec::new(),
        |url| {
            url.query_pairs()
                .filter(|(key, value)| holds_secret(key, value))
                .map(|(key, _)| key.into_owned())
                .collect()
        },
    )
}

/// Whether query parameter `key` holds a secret, or its `value` hides one behind a stray `?`
/// (`?sslmode=bogus?password=secret` reads as one parameter, `sslmode`).
fn holds_secret(key: &str, value: &str) -> bool {
    is_secret(key)
        || value
            .split(['?', '&', ';'])
            .skip(1)
            .any(|part| part.split_once('=').is_some_and(|(key, _)| is_secret(key)))
}

/// `text` (a driver's account of what is wrong with `url`) without the secrets `url` holds:
/// its password, and the values of its secret parameters, as written and as decoded, each
/// replaced with `***`. A driver quotes the value it could not read, and that value may hold
/// a password: a sink of your own that connects with a URL shows its driver's errors through
/// this, and the URL itself through [`redact_url`].
///
/// ```
/// use outbox_core::redact_url_in;
///
/// let url = "amqp:guest:hun%40ter2@broker/%2f";
/// assert_eq!(
///     redact_url_in(&format!("Invalid URL: '{url}'"), url),
///     "Invalid URL: 'amqp:guest:***@broker/%2f'"
/// );
/// ```
pub fn redact_url_in(text: &str, url: &str) -> String {
    let mut secrets: Vec<String> = Vec::new();
    if let Some(password) = raw_password(url) {
        secrets.push(password.to_owned());
        if let Ok(decoded) = percent_decode(password) {
            secrets.push(decoded);
        }
    }
    if let Ok(parsed) = url::Url::parse(url) {
        if let Some(password) = parsed.password() {
            secrets.push(password.to_owned());
            if let Ok(decoded) = percent_decode(password) {
                secrets.push(decoded);
            }
        }
        for (key, value) in parsed.query_pairs() {
            if holds_secret(&key, &value) {
                secrets.push(value.into_owned());
            }
        }
    }
    // The raw text of each secret parameter, before decoding.
    for pair in url.split(['?', '&']).skip(1) {
        if let Some((key, value)) = pair.split_once('=')
            && is_secret(&percent_decode(key).unwrap_or_else(|_| key.to_owned()))
        {
            secrets.push(value.to_owned());
        }
    }
    secrets.retain(|secret| !secret.is_empty());
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    secrets.iter().fold(text.to_owned(), |text, secret| {
        text.replace(secret.as_str(), HIDDEN)
    })
}

/// `text` with its percent-escapes decoded, if they decode to UTF-8.
fn percent_decode(text: &str) -> Result<String, std::str::Utf8Error> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
}

/// Whether a query parameter holds a secret: a password of any kind, a token, a secret.
fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "passwd", "secret", "token"]
        .iter()
        .any(|word| key.contains(word))
}

/// The scheme `url` begins with (`postgres` in `postgres://…`, `sqlite` in `sqlite:file`), if
/// any.
fn scheme(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once(':')?;
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some(scheme)
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    /// Every form of password sqlx accepts, each URL with what must not appear in it.
    const SECRET_URLS: &[&str] = &[
        "postgres://app:hunter2@db:5432/app",
        "postgresql://app:hunter2@db/app?sslmode=require",
        "postgres://app:hunter%32@db/app",
        "postgres://app:hun%40ter2@db/app",
        "postgres://app@db/app?password=hunter2",
        "postgres://app@db/app?sslmode=disable&password=hunter2&application_name=x",
        "postgres://app@db/app?pass%77ord=hunter2",
        "postgres://app@db/app?PASSWORD=hunter2",
        "postgres://app@db/app?sslpassword=hunter2",
        "postgres://app:hunter2@db:notaport/app",
        "postgres://app@db:notaport/app?password=hunter2",
        "postgres://app:hunter2@db/app?sslmode=bogus",
        "postgres://app:hun ter2@db/app",
        "sqlite:outbox.db?password=hunter2",
        "mysql://root:hunter2@db/app",
        "amqp:guest:hunter2@broker/%2f",
        "amqp:guest:hun%40ter2@broker:notaport/%2f",
        "postgres:app:hunter%32@db/app?sslmode=require",
        "postgres:/app:hunter2@db/app",
        "mysql://root@db/app?ssl-mode=bogus?password=hunter2",
        "host=db password=hunter2",
    ];

    #[test]
    fn no_form_of_password_survives() {
        for url in SECRET_URLS {
            let shown = redact_url(url);
            for secret in [
                "hunter2",
                "hunter%32",
                "hun%40ter2",
                "hun ter2",
                "hun%20ter2",
            ] {
                assert!(!shown.contains(secret), "{url} shown as {shown}");
            }
        }
    }

    #[test]
    fn a_reason_quoting_the_url_keeps_no_secret() {
        for (url, reason) in [
            (
                "mysql://root@db/app?ssl-mode=bogus?password=hunter2",
                "unknown value \"bogus?password=hunter2\" for `ssl_mode`",
            ),
            (
                "postgres://app:hun%40ter2@db/app",
                "cannot read hun%40ter2 (hun@ter2)",
            ),
            (
                "amqp:guest:hun%40ter2@broker/%2f",
                "Invalid URL: 'amqp:guest:hun%40ter2@broker/%2f' (hun@ter2)",
            ),
            (
                "postgres://app:hunter2@db:notaport/app",
                "invalid port in postgres://app:hunter2@db:notaport/app",
            ),
            (
                "postgres://app@db/app?pass%77ord=hunter2&sslmode=x",
                "sslmode x, pass%77ord=hunter2",
            ),
        ] {
            let scrubbed = super::redact_url_in(reason, url);
            assert!(
                !scrubbed.contains("hunter2") && !scrubbed.contains("hun@ter2"),
                "{scrubbed}"
            );
            assert!(scrubbed.contains("***"), "{scrubbed}");
        }
        assert_eq!(
            super::redact_url_in("port notaport", "postgres://app@db:5432/app"),
            "port notaport"
        );
    }

    #[test]
    fn what_is_not_secret_is_kept() {
        assert_eq!(
            redact_url("postgres://app:secret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(redact_url("postgres://app@db/app"), "postgres://app@db/app");
        assert_eq!(
            redact_url("postgres://app@db/app?sslmode=require&password=x"),
            "postgres://app@db/app?sslmode=require&password=***"
        );
        assert_eq!(redact_url("sqlite:outbox.db"), "sqlite:outbox.db");
        assert_eq!(
            redact_url("sqlite://data/outbox.db"),
            "sqlite://data/outbox.db"
        );
        assert_eq!(
            redact_url("amqp:guest:hunter2@broker/%2f"),
            "amqp:guest:***@broker/%2f"
        );
        assert_eq!(redact_url("postgres://db:notaport/x"), "postgres://…");
        assert_eq!(redact_url("not a url"), "…");
    }
}
