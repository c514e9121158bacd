//! Why a page or an action could not be served, as the page that says so.

use axum::http::StatusCode;
use outbox_core::error::error_chain;

/// Why a page or an action could not be served.
#[derive(Debug)]
pub(crate) enum PageError {
    /// What was asked for does not exist.
    NotFound(String),
    /// The request's input is not what the page reads.
    BadInput(String),
    /// The console is read-only.
    ReadOnly,
    /// No token, or not the console's.
    Unauthorized(String),
    /// A session whose form did not carry its token.
    Forbidden(String),
    /// A confirmation of what is no longer so.
    Stale(String),
    /// The outbox's database failed.
    Outbox(outbox_core::Error),
}

impl From<outbox_core::Error> for PageError {
    fn from(error: outbox_core::Error) -> Self {
        Self::Outbox(error)
    }
}

impl PageError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::BadInput(_) => StatusCode::BAD_REQUEST,
            Self::ReadOnly | Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Stale(_) => StatusCode::CONFLICT,
            Self::Outbox(error) if error.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            Self::Outbox(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub(crate) fn explain(&self) -> (&'static str, String) {
        match self {
            Self::NotFound(what) => ("Not found", format!("Not found: {what}.")),
            Self::BadInput(what) => ("Not understood", format!("{what}. Nothing changed.")),
            Self::ReadOnly => (
                "Read-only",
                "This console is read-only: start it with actions enabled (and a token) to act. \
                 Nothing changed."
                    .to_owned(),
            ),
            Self::Unauthorized(what) => ("Log in", format!("{what}. Nothing changed.")),
            Self::Forbidden(what) => ("Refused", format!("{what}. Nothing changed.")),
            Self::Stale(what) => ("Changed meanwhile", format!("{what}. Nothing changed.")),
            Self::Outbox(error) => ("The outbox failed", error_chain(error)),
        }
    }
}
