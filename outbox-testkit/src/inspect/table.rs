//! The table a failed assertion shows: the pending rows, marked, and the failing shards.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use outbox_core::CategoryId;

use super::{Expected, Pending};

/// At most this many rows are shown in a failure message; the counts are always exact.
const SHOWN_ROWS: usize = 100;

impl Pending {
    /// The pending rows as a table, each marked `*` if one of `expected` matches it or `~` if
    /// one matches it but for its payload; then the failing shards.
    pub fn table(&self, expected: &[Expected]) -> String {
        let mut names: BTreeMap<CategoryId, &'static str> = BTreeMap::new();
        for expected in expected {
            names.insert(expected.category, expected.name);
        }
        let header = [
            "",
            "id",
            "scope",
            "shard",
            "destination",
            "category",
            "object",
            "payload",
        ]
        .map(str::to_owned);
        let mut lines = vec![header];
        for row in self.rows.iter().take(SHOWN_ROWS) {
            let mark = if expected.iter().any(|e| e.matches(row)) {
                "*"
            } else if expected.iter().any(|e| e.addresses(row)) {
                "~"
            } else {
                ""
            };
            let category = match row
                .category_name
                .or_else(|| names.get(&row.category).copied())
            {
                Some(name) => format!("{name} (#{})", row.category),
                None => format!("#{}", row.category),
            };
            lines.push([
                mark.to_owned(),
                row.id.to_string(),
                row.shard.scope.to_string(),
                row.shard.shard_identifier.to_string(),
                row.destination()
                    .map_or("-".to_owned(), ToString::to_string),
                category,
                row.object_identifier.to_string(),
                row.payload_text(),
            ]);
        }
        let mut widths = [0; 8];
        for line in &lines {
            for (width, cell) in widths.iter_mut().zip(line) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut table = String::new();
        for line in &lines {
            // The marks' column only if a row is marked; ids right-aligned.
            if widths[0] > 0 {
                let _ = write!(table, "  {:<w$}", line[0], w = widths[0]);
            }
            let _ = write!(table, "  {:>w$}", line[1], w = widths[1]);
            for (cell, width) in line[2..].iter().zip(&widths[2..]) {
                let _ = write!(table, "  {cell:<width$}");
            }
            table.truncate(table.trim_end().len());
            table.push('\n');
        }
        if self.len() > SHOWN_ROWS {
            let _ = writeln!(table, "  ... and {} more", self.len() - SHOWN_ROWS);
        }
        let (matched, addressed) = self.rows.iter().fold((false, false), |(m, a), row| {
            (
                m || expected.iter().any(|e| e.matches(row)),
                a || expected.iter().any(|e| e.addresses(row) && !e.matches(row)),
            )
        });
        if matched || addressed {
            let mut legend = Vec::new();
            if matched {
                legend.push("* matches");
            }
            if addressed {
                legend.push("~ matches but for its payload");
            }
            let _ = writeln!(table, "  ({})", legend.join("; "));
        }
        if !self.failing.is_empty() {
            table.push_str("shards whose deliveries failed:\n");
            for state in &self.failing {
                // A parked shard counts no attempt (S26).
                let _ = match state.parked_category {
                    Some(category) => write!(
                        table,
                        "  {}: parked on unknown category #{category}",
                        state.shard
                    ),
                    None => write!(
                        table,
                        "  {}: {} failed attempt(s)",
                        state.shard, state.attempts
                    ),
                };
                if let Some(error) = &state.last_error {
                    let _ = write!(table, "; last error: {error}");
                }
                table.push('\n');
            }
        }
        table.truncate(table.trim_end().len());
        table
    }
}

impl fmt::Display for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            f.write_str("nothing pending")
        } else {
            write!(f, "{} pending:\n{}", self.len(), self.table(&[]))
        }
    }
}
