//! The few W3C WebDriver commands the browser tests send to ChromeDriver: a session, a page,
//! elements found, clicked and typed into, the page's source and a screenshot. Written here
//! (JSON over the HTTP client the tests already build) because the WebDriver crates bring
//! second major versions of `http`, `cookie` and ICU into the build.

use std::fmt;

use axum::body::Bytes;
use axum::http::{Method, Request};
use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

/// The key WebDriver names an element's reference by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Keys as WebDriver types them.
pub(crate) enum Key {
    Tab,
    Enter,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Key::Tab => "\u{E004}",
            Key::Enter => "\u{E007}",
        })
    }
}

/// How an element is found.
pub(crate) enum Locator<'a> {
    Id(&'a str),
    Css(&'a str),
    LinkText(&'a str),
    XPath(&'a str),
}

impl Locator<'_> {
    fn strategy(&self) -> Value {
        let (using, value) = match self {
            Locator::Id(id) => ("css selector", format!("[id=\"{id}\"]")),
            Locator::Css(css) => ("css selector", (*css).to_owned()),
            Locator::LinkText(text) => ("link text", (*text).to_owned()),
            Locator::XPath(path) => ("xpath", (*path).to_owned()),
        };
        json!({ "using": using, "value": value })
    }
}

/// What ChromeDriver refused, or could not be asked.
#[derive(Debug)]
pub(crate) struct WebDriverError(String);

impl fmt::Display for WebDriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

type Result<T> = std::result::Result<T, WebDriverError>;

/// A browser session.
#[derive(Clone)]
pub(crate) struct Client {
    http: HttpClient<HttpConnector, Full<Bytes>>,
    session: String,
}

/// An element of the page.
pub(crate) struct Element {
    client: Client,
    id: String,
}

async fn send(
    http: &HttpClient<HttpConnector, Full<Bytes>>,
    method: Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value> {
    let body = body.map_or_else(Bytes::new, |body| Bytes::from(body.to_string()));
    let request = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .map_err(|error| WebDriverError(error.to_string()))?;
    let response = http
        .request(request)
        .await
        .map_err(|error| WebDriverError(format!("{url}: {error}")))?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|error| WebDriverError(error.to_string()))?
        .to_bytes();
    let answer: Value = serde_json::from_slice(&bytes)
        .map_err(|error| WebDriverError(format!("{url}: {error}")))?;
    let value = answer.get("value").cloned().unwrap_or(Value::Null);
    if !status.is_success() {
        return Err(WebDriverError(format!(
            "{url}: {status}: {} {}",
            value["error"].as_str().unwrap_or("error"),
            value["message"].as_str().unwrap_or_default()
        )));
    }
    Ok(value)
}

impl Client {
    /// Opens a session on the driver at `url` with the browser's `capabilities`.
    pub(crate) async fn connect(url: &str, capabilities: Value) -> Result<Self> {
        let http = HttpClient::builder(TokioExecutor::new()).build(HttpConnector::new());
        let created = send(
            &http,
            Method::POST,
            &format!("{url}/session"),
            Some(json!({ "capabilities": { "alwaysMatch": capabilities } })),
        )
        .await?;
        let session = created["sessionId"]
            .as_str()
            .ok_or_else(|| WebDriverError(format!("no session id in {created}")))?;
        Ok(Self {
            http,
            session: format!("{url}/session/{session}"),
        })
    }

    async fn command(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value> {
        send(&self.http, method, &format!("{}{path}", self.session), body).await
    }

    fn element(&self, value: &Value) -> Result<Element> {
        let id = value[ELEMENT]
            .as_str()
            .ok_or_else(|| WebDriverError(format!("not an element: {value}")))?;
        Ok(Element {
            client: self.clone(),
            id: id.to_owned(),
        })
    }

    /// Loads `url`.
    pub(crate) async fn goto(&self, url: &str) -> Result<()> {
        self.command(Method::POST, "/url", Some(json!({ "url": url })))
            .await
            .map(drop)
    }

    /// The page's source.
    pub(crate) async fn source(&self) -> Result<String> {
        let value = self.command(Method::GET, "/source", None).await?;
        Ok(value.as_str().unwrap_or_default().to_owned())
    }

    /// The first element `locator` finds.
    pub(crate) async fn find(&self, locator: Locator<'_>) -> Result<Element> {
        let found = self
            .command(Method::POST, "/element", Some(locator.strategy()))
            .await?;
        self.element(&found)
    }

    /// The element that has the focus.
    pub(crate) async fn active_element(&self) -> Result<Element> {
        let found = self.command(Method::GET, "/element/active", None).await?;
        self.element(&found)
    }

    /// The page as a PNG image.
    pub(crate) async fn screenshot(&self) -> Result<Vec<u8>> {
        let value = self.command(Method::GET, "/screenshot", None).await?;
        base64::engine::general_purpose::STANDARD
            .decode(value.as_str().unwrap_or_default())
            .map_err(|error| WebDriverError(error.to_string()))
    }

    /// Ends the session (the browser closes).
    pub(crate) async fn close(&self) -> Result<()> {
        self.command(Method::DELETE, "", None).await.map(drop)
    }
}

impl Element {
    async fn command(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value> {
        let path = format!("/element/{}{path}", self.id);
        self.client.command(method, &path, body).await
    }

    /// Clicks it.
    pub(crate) async fn click(&self) -> Result<()> {
        self.command(Method::POST, "/click", Some(json!({})))
            .await
            .map(drop)
    }

    /// Types `text` into it.
    pub(crate) async fn send_keys(&self, text: &str) -> Result<()> {
        self.command(Method::POST, "/value", Some(json!({ "text": text })))
            .await
            .map(drop)
    }

    /// Its rendered text.
    pub(crate) async fn text(&self) -> Result<String> {
        let value = self.command(Method::GET, "/text", None).await?;
        Ok(value.as_str().unwrap_or_default().to_owned())
    }

    /// Chooses the option of this `<select>` whose value is `value`.
    pub(crate) async fn select_by_value(&self, value: &str) -> Result<()> {
        let found = self
            .command(
                Method::POST,
                "/element",
                Some(Locator::Css(&format!("option[value=\"{value}\"]")).strategy()),
            )
            .await?;
        self.client.element(&found)?.click().await
    }
}
