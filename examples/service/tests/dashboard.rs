//! The service's Prometheus metrics against the Grafana dashboard (`docs/grafana/outbox.json`):
//! the built binary on a fresh PostgreSQL database is given orders, some of which its handler
//! refuses until they are dead-lettered; then every query of every panel (and of the
//! dashboard's variables) is parsed as PromQL and each of its selectors must find a series in
//! the service's scrape, with every label its aggregations group by.
//!
//! The Prometheus alerting rules (`docs/prometheus/alerts.yml`) the same way: each rule's
//! expression is one of the alerts of `docs/observability.md`'s table (and each alert of the
//! table has its rule), and its selectors find their series in a fresh service's scrape.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::Service;
use outbox::telemetry;
use outbox::testkit::postgres::PgTestDatabase;
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

/// The Prometheus alerting rules, from the repository.
const ALERTS: &str = include_str!("../../../docs/prometheus/alerts.yml");

/// The alerts the docs describe: the table after "Alerts worth having".
const OBSERVABILITY: &str = include_str!("../../../docs/observability.md");

/// The runbooks the rules link to.
const OPERATING: &str = include_str!("../../../docs/operating.md");

/// The metrics of the alerting rules that the service cannot export, and why: their rules'
/// selectors are not looked for in its scrape (the metrics are `outbox::telemetry`'s).
const NOT_EXPORTED: [(&str, &str); 2] = [
    (
        telemetry::BREAKER_OPEN,
        "the service has no sink, so no breaker",
    ),
    (
        telemetry::BACKFILL_ERRORS,
        "the service has no replicated model to backfill",
    ),
];

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
        unexported: &[],
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

/// The checks of one dashboard (or of the alerting rules) against one scrape.
struct Check<'a> {
    scrape: &'a Scrape,
    problems: Vec<String>,
    /// The metric names the queries select.
    used: BTreeSet<String>,
    /// The panel or variable being checked, for the problems' messages.
    place: String,
    /// Metrics whose selectors are not looked for in the scrape ([`NOT_EXPORTED`]).
    unexported: &'a [(&'a str, &'a str)],
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
            if self
                .unexported
                .iter()
                .any(|(unexported, _)| unexported == name)
            {
                return;
            }
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

#[test]
fn the_alert_rules_are_the_alerts_the_docs_describe() {
    let rules = Rule::read_all(ALERTS)
        .unwrap_or_else(|problem| panic!("docs/prometheus/alerts.yml: {problem}"));
    let documented = documented_alerts(OBSERVABILITY);
    assert!(
        !documented.is_empty(),
        "docs/observability.md has no table of alerts after \"Alerts worth having\""
    );
    let anchors = anchors(OPERATING);
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    let mut ruled = BTreeSet::new();
    for rule in &rules {
        let place = format!("alert {} (line {})", rule.alert, rule.line);
        if !names.insert(rule.alert.as_str()) {
            problems.push(format!("{place}: a second alert of that name"));
        }
        for field in Rule::FIELDS {
            if rule.field(field).is_empty() {
                problems.push(format!("{place}: no `{field}`"));
            }
        }
        match rule.alerted() {
            Ok(expression) => {
                if !documented.contains(&expression) {
                    problems.push(format!(
                        "{place}: `{expression}` is not an alert of docs/observability.md's table"
                    ));
                }
                ruled.insert(expression);
            }
            Err(problem) => problems.push(format!("{place}: {problem}")),
        }
        if !is_duration(rule.field("for")) {
            problems.push(format!(
                "{place}: `for: {}` is not a Prometheus duration",
                rule.field("for")
            ));
        }
        if !["critical", "warning"].contains(&rule.field("severity")) {
            problems.push(format!(
                "{place}: severity {:?} is neither critical nor warning",
                rule.field("severity")
            ));
        }
        let runbook = rule.field("runbook_url");
        match runbook.strip_prefix("docs/operating.md#") {
            Some(anchor) if anchors.contains(anchor) => {}
            _ => problems.push(format!(
                "{place}: runbook_url {runbook:?} is not a heading of docs/operating.md \
                 (docs/operating.md#...)"
            )),
        }
    }
    for expression in documented.difference(&ruled) {
        problems.push(format!(
            "docs/observability.md's alert `{expression}` has no rule in docs/prometheus/alerts.yml"
        ));
    }
    assert!(
        problems.is_empty(),
        "docs/prometheus/alerts.yml against docs/observability.md and docs/operating.md:\n{}",
        problems.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_alert_rule_finds_its_series_in_the_scrape() {
    let rules = Rule::read_all(ALERTS).expect("docs/prometheus/alerts.yml");
    let database = PgTestDatabase::create().await;
    let service = Service::start(&database.url(), &[]);
    service.wait_for("/readyz", 200).await;

    // The relay reports its counters at 0 when it starts, and the scrape refreshes the gauges:
    // a service that did nothing yet has every series the rules select.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let scrape = Scrape::get(&service);
        let problems = check_alerts(&rules, &scrape);
        if problems.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "docs/prometheus/alerts.yml against the scrape:\n{}\n\nThe scrape:\n{}",
            problems.join("\n"),
            scrape.text
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (status, _) = service.terminate().await;
    assert!(status.success(), "exits 0 on SIGTERM: {status:?}");
}

/// Every problem of the rules' expressions against the scrape, each naming its alert and
/// selector: as for the dashboard, each selector must match a series, with every label its
/// aggregations group by, but for the metrics the service cannot export ([`NOT_EXPORTED`]),
/// which must then be absent from the scrape.
fn check_alerts(rules: &[Rule], scrape: &Scrape) -> Vec<String> {
    let mut check = Check {
        scrape,
        problems: Vec::new(),
        used: BTreeSet::new(),
        place: String::new(),
        unexported: &NOT_EXPORTED,
    };
    for rule in rules {
        check.place = format!("alert {}", rule.alert);
        check.query(rule.field("expr"));
    }
    for (name, why) in NOT_EXPORTED {
        if scrape.types.contains_key(name) {
            check.problems.push(format!(
                "the scrape has {name}, which NOT_EXPORTED says it cannot have ({why}): \
                 check its rules against the scrape"
            ));
        }
    }
    check.problems
}

/// One alerting rule of `docs/prometheus/alerts.yml`, read line by line: the file keeps each
/// field on one line (no block scalars), as this reader requires of it.
#[derive(Debug)]
struct Rule {
    /// Its name.
    alert: String,
    /// Its line in the file.
    line: usize,
    /// Its fields: those of [`Rule::FIELDS`], labels and annotations included.
    fields: BTreeMap<String, String>,
}

impl Rule {
    /// The fields each rule must have.
    const FIELDS: [&str; 6] = [
        "expr",
        "for",
        "severity",
        "summary",
        "description",
        "runbook_url",
    ];

    /// The rules of `text`, or what a line-based reader cannot read in it.
    fn read_all(text: &str) -> Result<Vec<Self>, String> {
        let mut rules: Vec<Self> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line_number = index + 1;
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let entry = trimmed.strip_prefix("- ").unwrap_or(trimmed);
            let Some((key, value)) = entry.split_once(':') else {
                return Err(format!("line {line_number}: {line:?} is not `key: value`"));
            };
            let value = value.trim();
            if key == "alert" {
                rules.push(Self {
                    alert: value.to_owned(),
                    line: line_number,
                    fields: BTreeMap::new(),
                });
                continue;
            }
            let Some(rule) = rules.last_mut() else {
                continue;
            };
            if !Self::FIELDS.contains(&key) {
                continue;
            }
            if value.starts_with(['|', '>', '\'']) {
                return Err(format!(
                    "line {line_number}: write `{key}` on its line, as a plain or double-quoted \
                     scalar"
                ));
            }
            let value = value
                .strip_prefix('"')
                .and_then(|quoted| quoted.strip_suffix('"'))
                .unwrap_or(value);
            if rule
                .fields
                .insert(key.to_owned(), value.to_owned())
                .is_some()
            {
                return Err(format!("line {line_number}: a second `{key}` in one rule"));
            }
        }
        if rules.is_empty() {
            return Err("no `- alert:` rule".into());
        }
        Ok(rules)
    }

    /// The value of `field`, empty if the rule lacks it.
    fn field(&self, field: &str) -> &str {
        self.fields.get(field).map_or("", String::as_str)
    }

    /// What the rule alerts on: its expression is `<what> <comparison> <number>`, and this is
    /// `<what>`, as PromQL prints it.
    fn alerted(&self) -> Result<String, String> {
        let expr = self.field("expr");
        match parser::parse(expr) {
            Ok(Expr::Binary(binary))
                if binary.op.is_comparison_operator()
                    && matches!(*binary.rhs, Expr::NumberLiteral(_)) =>
            {
                Ok(binary.lhs.to_string())
            }
            Ok(_) => Err(format!(
                "`{expr}` is not `<expression> <comparison> <number>`"
            )),
            Err(error) => Err(format!("`{expr}` is not PromQL: {error}")),
        }
    }
}

/// The expressions of the table after "Alerts worth having" in `docs/observability.md`, as
/// PromQL prints them (an expression that does not parse is kept as written, to be reported).
fn documented_alerts(markdown: &str) -> BTreeSet<String> {
    let Some(at) = markdown.find("Alerts worth having") else {
        return BTreeSet::new();
    };
    markdown[at..]
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2) // the header and its separator
        .filter_map(|row| row.split('|').nth(1))
        .map(|cell| cell.trim().trim_matches('`'))
        .map(|expression| {
            parser::parse(expression).map_or_else(|_| expression.to_owned(), |ast| ast.to_string())
        })
        .collect()
}

/// The anchors of a Markdown file's headings, as GitHub makes them.
fn anchors(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| {
            heading
                .trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

/// Whether `text` is a Prometheus duration: units from `y` to `ms`, each with its number
/// (`5m`, `1h30m`, `0s`).
fn is_duration(text: &str) -> bool {
    let mut rest = text;
    let mut units = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let Some(unit) = ["ms", "y", "w", "d", "h", "m", "s"]
            .into_iter()
            .find(|unit| rest.starts_with(unit))
        else {
            return false;
        };
        rest = &rest[unit.len()..];
        units += 1;
    }
    units > 0
}
