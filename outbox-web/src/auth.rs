//! Who may act: the console's token, given as a bearer header or once in the login form
//! (which opens a session, kept in a cookie), and each session's token against cross-site
//! forms.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE};
use subtle::ConstantTimeEq;

use crate::error::PageError;

/// The session cookie's name.
pub(crate) const COOKIE_NAME: &str = "outbox_console";

/// How long a session lasts without logging in again.
const SESSION_FOR: Duration = Duration::from_secs(12 * 3_600);

/// The form field that carries a session's token against cross-site requests.
pub(crate) const CSRF_FIELD: &str = "csrf";

/// A logged-in operator.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// The cookie's value.
    pub(crate) id: String,
    /// Who logged in, as they named themselves.
    pub(crate) operator: String,
    /// What every form of the session carries.
    pub(crate) csrf: String,
    expires: Instant,
}

/// The open sessions.
#[derive(Debug, Default)]
pub(crate) struct Sessions(Mutex<HashMap<String, Session>>);

impl Sessions {
    /// Opens a session for `operator`.
    pub(crate) fn open(&self, operator: &str) -> Session {
        let session = Session {
            id: random_token(),
            operator: operator.to_owned(),
            csrf: random_token(),
            expires: Instant::now() + SESSION_FOR,
        };
        let mut sessions = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        sessions.retain(|_, open| open.expires > now);
        sessions.insert(session.id.clone(), session.clone());
        session
    }

    /// The session a request's cookie names, if it is open.
    pub(crate) fn of(&self, headers: &HeaderMap) -> Option<Session> {
        let id = cookie(headers, COOKIE_NAME)?;
        let sessions = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        sessions
            .get(id)
            .filter(|session| session.expires > Instant::now())
            .cloned()
    }

    /// Closes session `id`.
    pub(crate) fn close(&self, id: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }
}

/// 32 random bytes, in hexadecimal.
pub(crate) fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Whether `given` is `expected`, in a time that does not depend on where they differ.
pub(crate) fn same(given: &str, expected: &str) -> bool {
    given.as_bytes().ct_eq(expected.as_bytes()).into()
}

/// The value of cookie `name` in a request.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// The bearer token of a request, if it gives one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Who asks for an action, if they may: the console must allow actions; a bearer header must
/// give its token; otherwise the session's cookie must name an open session and the form
/// carry that session's token (`csrf`). The name the action is logged under.
pub(crate) fn authorize(
    token: Option<&str>,
    sessions: &Sessions,
    headers: &HeaderMap,
    csrf: Option<&str>,
) -> Result<String, PageError> {
    let Some(token) = token else {
        return Err(PageError::ReadOnly);
    };
    if let Some(given) = bearer(headers) {
        return if same(given, token) {
            Ok("bearer token".to_owned())
        } else {
            Err(PageError::Unauthorized(
                "the bearer token is not the console's".to_owned(),
            ))
        };
    }
    let Some(session) = sessions.of(headers) else {
        return Err(PageError::Unauthorized(
            "log in with the console's token to act".to_owned(),
        ));
    };
    match csrf {
        Some(given) if same(given, &session.csrf) => Ok(session.operator),
        _ => Err(PageError::Forbidden(
            "the form does not carry your session's token (it came from another site, or from \
             before you logged in again): reload the page and try again"
                .to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn an_action_needs_the_token_or_a_session_and_its_form_token() {
        let sessions = Sessions::default();
        let token = Some("a-token-of-sixteen-or-more");
        let mut headers = HeaderMap::new();
        assert!(matches!(
            authorize(None, &sessions, &headers, None),
            Err(PageError::ReadOnly)
        ));
        assert!(matches!(
            authorize(token, &sessions, &headers, None),
            Err(PageError::Unauthorized(_))
        ));
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer wrong"));
        assert!(matches!(
            authorize(token, &sessions, &headers, None),
            Err(PageError::Unauthorized(_))
        ));
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_static("bearer a-token-of-sixteen-or-more"),
        );
        assert_eq!(
            authorize(token, &sessions, &headers, None).unwrap(),
            "bearer token"
        );

        let session = sessions.open("ada");
        let mut headers = HeaderMap::new();
        headers.insert(
            COOKIE,
            HeaderValue::from_str(&format!("theme=dark; {COOKIE_NAME}={}", session.id)).unwrap(),
        );
        assert!(matches!(
            authorize(token, &sessions, &headers, Some("forged")),
            Err(PageError::Forbidden(_))
        ));
        assert_eq!(
            authorize(token, &sessions, &headers, Some(&session.csrf)).unwrap(),
            "ada"
        );
        sessions.close(&session.id);
        assert!(matches!(
            authorize(token, &sessions, &headers, Some(&session.csrf)),
            Err(PageError::Unauthorized(_))
        ));
    }
}
