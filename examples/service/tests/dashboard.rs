//! The service's Prometheus metrics against the Grafana dashboard (`docs/grafana/outbox.json`):
//! the built binary on a fresh PostgreSQL database is given orders, some of which its handler
//! refuses until they are dead-lettered; then every query of every panel (and of the
//! dashboard's variables) is parsed as PromQL and each of its selectors must find a series in
//! the service's scrape, with every label its aggregations group by.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::Service;
use outbox_testkit::postgres::PgTestDatabase;
use promql_parser::label::Matcher;
use promql_parser::parser::{self, Expr, LabelModifier, VectorSelector};
use serde_json::Value;

/// Orders the carrier insures (up to $10,000, the limit included): shipped.
const SHIPPED: [i64; 5] = [1250, 4999, 120, 99_999, 1_000_000];
/// Orders above what the carrier insures: refused by the handler, then dead-lettered.
const REFUSED: [i64; 2] = [1_500_000, 25_000_000];
/// `OrderPlaced`'s `max_attempts`.
const MAX_ATTEMPTS: f64 = 3.0;

/// The dashboard, from the repository.
const DASHBOARD: &str = include_str!("../../../docs/grafana/outbox.json");

/// What Grafana's built-in variables stand for in the test.
const GRAFANA_VARIABLES: [(&str, &str); 4] = [
    ("__rate_interval", "1m"),
    ("__interval", "15s"),
    ("__range", "1h"),
    ("__range_s", "3600"),
];

#[tokio::test(flavor = "multi_thread")]
async fn every_dashboard_query_finds_its_series_in_the_scrape() {
    let database = PgTestDatabase::create().await;
    let service = Service::start(
        &database.url(),
        &["--backoff-initial-ms", "10", "--poll-interval-ms", "50"],
    );
    service.wait_for("/readyz", 200).await;

    let mut shipped = BTreeMap::new();
    for total in SHIPPED.into_iter().chain(REFUSED) {
        let body = format!(r#"{{"total_cents": {total}}}"#);
        let (status, created) = service
            .request_json("POST", "/orders", &body)
            .expect("POST /orders");
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_i64().expect("the order's id");
        if SHIPPED.contains(&total) {
            shipped.insert(id, total);
        }
    }

    // The good orders shipped, the refused ones dead-lettered: in the database...
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows: Vec<(i64, i64)> = sqlx::query_as("SELECT order_id, total_cents FROM shipments")
            .fetch_all(database.pool())
            .await
            .expect("read shipments");
        let (dead,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox_dead_letters")
            .fetch_one(database.pool())
            .await
            .expect("count dead letters");
        if rows.len() == SHIPPED.len() && dead == REFUSED.len() as i64 {
            assert_eq!(rows.into_iter().collect::<BTreeMap<_, _>>(), shipped);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "within 30 s, {} of {} orders shipped and {dead} of {} dead-lettered",
            rows.len(),
            SHIPPED.len(),
            REFUSED.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let errors: Vec<(String, i32)> =
        sqlx::query_as("SELECT error, attempts FROM outbox_dead_letters")
            .fetch_all(database.pool())
            .await
            .expect("read dead letters");
    for (error, attempts) in errors {
        assert!(error.contains("the carrier insures up to"), "{error}");
        assert_eq!(f64::from(attempts), MAX_ATTEMPTS, "{error}");
    }
    // ... and in the scrape (the relay counts a dead letter once it is stored).
    let orders = "category=\"order_placed\",scope=\"orders\"";
    let counted = [
        (format!("outbox_messages_written_total{{{orders}}}"), 7.0),
        (format!("outbox_deliveries_total{{{orders}}}"), 5.0),
        (
            format!("outbox_handler_failures_total{{{orders},kind=\"handler\"}}"),
            MAX_ATTEMPTS * 2.0,
        ),
        (format!("outbox_dead_lettered_total{{{orders}}}"), 2.0),
        (
            "outbox_rows_acknowledged_total{scope=\"orders\"}".into(),
            5.0,
        ),
        ("outbox_dead_letters".into(), 2.0),
        ("outbox_pending_messages".into(), 0.0),
        ("outbox_oldest_pending_age_seconds".into(), 0.0),
        ("sum(outbox_shards)".into(), 0.0),
        ("outbox_lease_losses_total{scope=\"orders\"}".into(), 0.0),
        ("sum(outbox_database_errors_total)".into(), 0.0),
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    let scrape = loop {
        let scrape = Scrape::get(&service);
        let wrong: Vec<String> = counted
            .iter()
            .filter_map(|(query, expected)| {
                let value = scrape.value(query);
                (value != Some(*expected)).then(|| format!("{query} = {value:?}, not {expected}"))
            })
            .collect();
        if wrong.is_empty() {
            break scrape;
        }
        assert!(
            Instant::now() < deadline,
            "the scrape's values, 10 s after the orders were done:\n{}\n\n{}",
            wrong.join("\n"),
            scrape.text
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for histogram in [
        "outbox_handler_duration_seconds",
        "outbox_delivery_lag_seconds",
        "outbox_shard_drain_duration_seconds",
        "outbox_shard_drain_rows",
    ] {
        assert_eq!(
            scrape.types.get(histogram).map(String::as_str),
            Some("histogram"),
            "{histogram} is rendered as a Prometheus histogram, with buckets"
        );
    }

    let problems = check_dashboard(&serde_json::from_str(DASHBOARD).expect("JSON"), &scrape);
    assert!(
        problems.is_empty(),
        "docs/grafana/outbox.json against the scrape:\n{}\n\nThe scrape:\n{}",
        problems.join("\n"),
        scrape.text
    );

    let (status, _) = service.terminate().await;
    assert!(status.success(), "exits 0 on SIGTERM: {status:?}");
}

/// Every problem of the dashboard's queries against the scrape, each naming its panel (or
/// variable) and selector.
fn check_dashboard(dashboard: &Value, scrape: &Scrape) -> Vec<String> {
    let variables = variables(dashboard);
    let mut check = Check {
        scrape,
        problems: Vec::new(),
        used: BTreeSet::new(),
        place: String::new(),
    };
    let mut panels = Vec::new();
    collect_panels(&dashboard["panels"], &mut panels);
    let mut queries = 0;
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        if panel["type"] != "row" && panel["datasource"]["uid"] != "${datasource}" {
            let problem =
                format!("panel {title:?}: its data source is not the `datasource` variable");
            check.problems.push(problem);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let Some(expr) = target["expr"].as_str() else {
                check
                    .problems
                    .push(format!("panel {title:?}: a target without `expr`"));
                continue;
            };
            queries += 1;
            check.place = format!("panel {title:?}");
            check.query(&substitute(expr, &variables));
        }
    }
    if queries == 0 {
        check.problems.push("the dashboard has no queries".into());
    }

    // The variables' `label_values(selector, label)` queries.
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let name = variable["name"].as_str().unwrap_or_default();
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .unwrap_or_default();
        check.place = format!("variable ${name}");
        let Some((selector, label)) = query
            .strip_prefix("label_values(")
            .and_then(|rest| rest.strip_suffix(')'))
            .and_then(|args| args.rsplit_once(','))
        else {
            let problem =
                format!("variable ${name}: {query:?} is not label_values(selector, label)");
            check.problems.push(problem);
            continue;
        };
        match parser::parse(&substitute(selector, &variables)) {
            Ok(Expr::VectorSelector(selector)) => {
                check.selector(&selector, &[label.trim().to_owned()], false);
            }
            other => check.problems.push(format!(
                "variable ${name}: {selector:?} is not a selector: {other:?}"
            )),
        }
    }

    // Every outbox metric of the scrape has a panel.
    for family in scrape
        .types
        .keys()
        .filter(|name| name.starts_with("outbox_"))
    {
        let shown = check.used.iter().any(|name| {
            name == family
                || ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| name.strip_suffix(suffix) == Some(family.as_str()))
        });
        if !shown {
            check.problems.push(format!("no panel shows {family}"));
        }
    }
    check.problems
}

/// The panels, those of collapsed rows included.
fn collect_panels<'a>(panels: &'a Value, into: &mut Vec<&'a Value>) {
    for panel in panels.as_array().into_iter().flatten() {
        into.push(panel);
        collect_panels(&panel["panels"], into);
    }
}

/// What each variable stands for: Grafana's built-in ones a concrete value, the dashboard's
/// own (`$scope`, `$category`, ...) any non-empty value, as when "All" is chosen.
fn variables(dashboard: &Value) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = GRAFANA_VARIABLES
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(name) = variable["name"].as_str() {
            all.push((name.to_owned(), ".+".to_owned()));
        }
    }
    // The longest first, so that `$__range_s` is not taken for `$__range` and `_s`.
    all.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    all
}

/// `expr` with its variables (`$name`, `${name}`, `[[name]]`) replaced.
fn substitute(expr: &str, variables: &[(String, String)]) -> String {
    let mut expr = expr.to_owned();
    for (name, value) in variables {
        for form in [
            format!("${{{name}}}"),
            format!("[[{name}]]"),
            format!("${name}"),
        ] {
            expr = expr.replace(&form, value);
        }
    }
    expr
}

/// The checks of one dashboard against one scrape.
struct Check<'a> {
    scrape: &'a Scrape,
    problems: Vec<String>,
    /// The metric names the queries select.
    used: BTreeSet<String>,
    /// The panel or variable being checked, for the problems' messages.
    place: String,
}

impl Check<'_> {
    fn query(&mut self, expr: &str) {
        if let Some(at) = expr.find('$') {
            let problem = format!("{}: {expr:?} keeps a variable at {at}", self.place);
            self.problems.push(problem);
            return;
        }
        match parser::parse(expr) {
            Ok(ast) => self.walk(&ast, &[], false),
            Err(error) => {
                let problem = format!("{}: {expr:?} is not PromQL: {error}", self.place);
                self.problems.push(problem);
            }
        }
    }

    /// Checks every selector under `expr`; `by` are the labels that the aggregations (and
    /// `on (...)` matchings) above it name, `quantile` whether it is under
    /// `histogram_quantile`.
    fn walk(&mut self, expr: &Expr, by: &[String], quantile: bool) {
        match expr {
            Expr::Aggregate(aggregate) => {
                let mut by = by.to_vec();
                if let Some(modifier) = &aggregate.modifier {
                    let labels = &modifier.labels().labels;
                    if quantile
                        && matches!(modifier, LabelModifier::Include(_))
                        && !labels.iter().any(|label| label == "le")
                    {
                        let problem = format!(
                            "{}: `{expr}` under histogram_quantile drops the `le` label",
                            self.place
                        );
                        self.problems.push(problem);
                    }
                    by.extend(labels.iter().cloned());
                } else if quantile {
                    let problem = format!(
                        "{}: `{expr}` under histogram_quantile drops the `le` label",
                        self.place
                    );
                    self.problems.push(problem);
                }
                if let Some(param) = &aggregate.param {
                    self.walk(param, &[], false);
                }
                self.walk(&aggregate.expr, &by, quantile);
            }
            Expr::Call(call) => {
                let histogram = call.func.name == "histogram_quantile";
                for (position, arg) in call.args.args.iter().enumerate() {
                    self.walk(arg, by, quantile || (histogram && position == 1));
                }
            }
            Expr::Binary(binary) => {
                let mut by = by.to_vec();
                if let Some(LabelModifier::Include(on)) = binary
                    .modifier
                    .as_ref()
                    .and_then(|modifier| modifier.matching.as_ref())
                {
                    by.extend(on.labels.iter().cloned());
                }
                self.walk(&binary.lhs, &by, quantile);
                self.walk(&binary.rhs, &by, quantile);
            }
            Expr::Paren(paren) => self.walk(&paren.expr, by, quantile),
            Expr::Unary(unary) => self.walk(&unary.expr, by, quantile),
            Expr::Subquery(subquery) => self.walk(&subquery.expr, by, quantile),
            Expr::MatrixSelector(matrix) => self.selector(&matrix.vs, by, quantile),
            Expr::VectorSelector(selector) => self.selector(selector, by, quantile),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
        }
    }

    /// The selector must match a series of the scrape, each with every label of `by`; under
    /// `histogram_quantile`, a `_bucket` series.
    fn selector(&mut self, selector: &VectorSelector, by: &[String], quantile: bool) {
        let name = selector.name.clone().or_else(|| {
            selector
                .matchers
                .matchers
                .iter()
                .find(|matcher| matcher.name == "__name__")
                .map(|matcher| matcher.value.clone())
        });
        if let Some(name) = &name {
            self.used.insert(name.clone());
        }
        if quantile
            && !name
                .as_deref()
                .is_some_and(|name| name.ends_with("_bucket"))
        {
            let problem = format!(
                "{}: `{selector}` under histogram_quantile is not a `_bucket` series",
                self.place
            );
            self.problems.push(problem);
        }
        let matched: Vec<&Series> = self
            .scrape
            .series
            .iter()
            .filter(|series| series.matches(selector))
            .collect();
        if matched.is_empty() {
            let problem = format!(
                "{}: `{selector}` matches no series of the scrape",
                self.place
            );
            self.problems.push(problem);
            return;
        }
        for label in by {
            if let Some(series) = matched
                .iter()
                .find(|series| !series.labels.contains_key(label))
            {
                let problem = format!(
                    "{}: `{selector}` matches {series}, which lacks the label `{label}` it is \
                     grouped by",
                    self.place
                );
                self.problems.push(problem);
            }
        }
    }
}

/// One sample of the scrape.
#[derive(Debug)]
struct Series {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

impl Series {
    fn label(&self, name: &str) -> &str {
        if name == "__name__" {
            return &self.name;
        }
        self.labels.get(name).map_or("", String::as_str)
    }

    /// Whether PromQL's `selector` selects this series.
    fn matches(&self, selector: &VectorSelector) -> bool {
        let all = |matchers: &[Matcher]| {
            matchers
                .iter()
                .all(|matcher| matcher.is_match(self.label(&matcher.name)))
        };
        let matchers = &selector.matchers;
        selector.name.as_ref().is_none_or(|name| *name == self.name)
            && all(&matchers.matchers)
            && (matchers.or_matchers.is_empty()
                || matchers.or_matchers.iter().any(|group| all(group)))
    }
}

impl std::fmt::Display for Series {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<String> = (self.labels.iter())
            .map(|(name, value)| format!("{name}={value:?}"))
            .collect();
        write!(f, "{}{{{}}}", self.name, labels.join(","))
    }
}

/// The service's `/metrics`, parsed (the Prometheus text format, 0.0.4).
struct Scrape {
    text: String,
    series: Vec<Series>,
    /// Each metric family's type, from its `# TYPE` line.
    types: BTreeMap<String, String>,
}

impl Scrape {
    fn get(service: &Service) -> Self {
        let (status, text) = service
            .request("GET", "/metrics", "")
            .expect("GET /metrics");
        assert_eq!(status, 200, "{text}");
        let mut series = Vec::new();
        let mut types = BTreeMap::new();
        for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            if let Some(comment) = line.strip_prefix('#') {
                let mut words = comment.split_whitespace();
                if let (Some("TYPE"), Some(name), Some(kind)) =
                    (words.next(), words.next(), words.next())
                {
                    types.insert(name.to_owned(), kind.to_owned());
                }
                continue;
            }
            series.push(parse_sample(line).unwrap_or_else(|| panic!("a sample: {line:?}")));
        }
        Self {
            text,
            series,
            types,
        }
    }

    /// The value of one series (`name{label="value",...}`, all its labels given), or the sum
    /// of a metric's series (`sum(name)`).
    fn value(&self, query: &str) -> Option<f64> {
        if let Some(name) = query.strip_prefix("sum(").and_then(|q| q.strip_suffix(')')) {
            let values = self.series.iter().filter(|series| series.name == name);
            return values.map(|series| series.value).reduce(|a, b| a + b);
        }
        let wanted = parse_sample(&format!("{query} 0"))?;
        self.series
            .iter()
            .find(|series| series.name == wanted.name && series.labels == wanted.labels)
            .map(|series| series.value)
    }
}

/// One sample line: `name{label="value",...} value [timestamp]`.
fn parse_sample(line: &str) -> Option<Series> {
    let end = line.find(['{', ' '])?;
    let name = line[..end].to_owned();
    let mut rest = &line[end..];
    let mut labels = BTreeMap::new();
    if let Some(mut inside) = rest.strip_prefix('{') {
        loop {
            inside = inside.trim_start_matches([' ', ',']);
            if let Some(after) = inside.strip_prefix('}') {
                rest = after;
                break;
            }
            let (label, after) = inside.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let closed = loop {
                match chars.next()? {
                    (at, '"') => break at,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        escaped => value.push(escaped),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.insert(label.trim().to_owned(), value);
            inside = &after[closed + 1..];
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Series {
        name,
        labels,
        value,
    })
}
