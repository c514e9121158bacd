//! The fields of a form or a query string, as given: a name may come more than once (the
//! dead letters a form selects).

/// The fields of an `application/x-www-form-urlencoded` body or query, in order.
#[derive(Debug, Default)]
pub(crate) struct Fields(Vec<(String, String)>);

impl Fields {
    /// Reads `bytes`, a form body or a query string.
    pub(crate) fn parse(bytes: &[u8]) -> Self {
        Self(
            form_urlencoded::parse(bytes)
                .map(|(name, value)| (name.into_owned(), value.into_owned()))
                .collect(),
        )
    }

    /// The query string of `uri`.
    pub(crate) fn query(uri: &axum::http::Uri) -> Self {
        Self::parse(uri.query().unwrap_or_default().as_bytes())
    }

    /// The first value of `name`, trimmed, if it is given and not empty.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(field, value)| field == name && !value.trim().is_empty())
            .map(|(_, value)| value.trim())
    }

    /// Every value of `name`, trimmed, the empty ones left out.
    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.0
            .iter()
            .filter(move |(field, value)| field == name && !value.trim().is_empty())
            .map(|(_, value)| value.trim())
    }
}

#[cfg(test)]
mod tests {
    use super::Fields;

    #[test]
    fn repeated_names_and_encoded_values_read_back() {
        let fields = Fields::parse(b"id=1&id=2&reason=an+incident%2C+42&id=&empty=");
        assert_eq!(fields.all("id").collect::<Vec<_>>(), ["1", "2"]);
        assert_eq!(fields.get("reason"), Some("an incident, 42"));
        assert_eq!(fields.get("empty"), None);
        assert_eq!(fields.get("missing"), None);
    }
}
