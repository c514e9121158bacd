//! Where the generated code finds the crates it names.
//!
//! The expansions write their paths as `::outbox_core::...` and `::outbox_testkit::...`: the
//! names those crates' libraries have, under which a service that depends on them directly
//! sees them. A service may instead depend on the `outbox` crate alone (which re-exports them
//! under its features), or rename a dependency in its `Cargo.toml`. [`rebase`] then rewrites
//! those paths to where the service's own manifest says the crates are, found with
//! `proc-macro-crate`: the renamed dependency, or `::outbox::__core` / `::outbox::__testkit`.

use proc_macro_crate::{FoundCrate, crate_name};
use proc_macro2::{Group, Ident, Punct, Spacing, Span, TokenStream, TokenTree};

/// The package of the crate users add for everything, re-exporting the others.
const FACADE: &str = "outbox";

/// A crate the expansions name.
struct Named {
    /// Its library's name, as the expansions write it after `::`.
    library: &'static str,
    /// Its package's name, as a service's `Cargo.toml` names it.
    package: &'static str,
    /// Where the facade re-exports it.
    in_facade: &'static str,
}

const CORE: Named = Named {
    library: "outbox_core",
    package: "outbox-rs-core",
    in_facade: "__core",
};

const TESTKIT: Named = Named {
    library: "outbox_testkit",
    package: "outbox-rs-testkit",
    in_facade: "__testkit",
};

/// Where the crate being compiled finds `named`, as path segments after the leading `::`;
/// `None` where the expansions' own path serves (a direct dependency under its library's
/// name, or a manifest that names neither the crate nor the facade: the compiler's error
/// then names the crate).
fn segments(named: &Named) -> Option<Vec<String>> {
    match crate_name(named.package) {
        // Renamed in the manifest: the code knows it by its key. (Under its package's name,
        // unrenamed, or in the package's own tests, it has its library's name.)
        Ok(FoundCrate::Name(name))
            if name != named.library && name != named.package.replace('-', "_") =>
        {
            return Some(vec![name]);
        }
        Ok(_) => return None,
        Err(_) => {}
    }
    match crate_name(FACADE) {
        Ok(FoundCrate::Name(name)) => Some(vec![name, named.in_facade.to_owned()]),
        // The facade's own tests and examples: its library's name.
        Ok(FoundCrate::Itself) => Some(vec![FACADE.to_owned(), named.in_facade.to_owned()]),
        Err(_) => None,
    }
}

/// `tokens`, with every `::outbox_core` and `::outbox_testkit` rewritten to where the crate
/// being compiled finds those crates.
pub(crate) fn rebase(tokens: TokenStream) -> TokenStream {
    let targets: Vec<(&'static str, Vec<String>)> = [CORE, TESTKIT]
        .iter()
        .filter(|named| mentions(&tokens, named.library))
        .filter_map(|named| Some((named.library, segments(named)?)))
        .collect();
    if targets.is_empty() {
        return tokens;
    }
    rewrite(tokens, &targets)
}

/// Whether `tokens` hold the identifier `name` anywhere.
fn mentions(tokens: &TokenStream, name: &str) -> bool {
    tokens.clone().into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => ident == name,
        TokenTree::Group(group) => mentions(&group.stream(), name),
        _ => false,
    })
}

/// Rewrites the identifiers of `targets` that follow `::` into their segments.
fn rewrite(tokens: TokenStream, targets: &[(&'static str, Vec<String>)]) -> TokenStream {
    let mut out: Vec<TokenTree> = Vec::new();
    for tree in tokens {
        match tree {
            TokenTree::Group(group) => {
                let mut rewritten = Group::new(group.delimiter(), rewrite(group.stream(), targets));
                rewritten.set_span(group.span());
                out.push(TokenTree::Group(rewritten));
            }
            TokenTree::Ident(ident) if after_path_separator(&out) => {
                match targets.iter().find(|(library, _)| ident == library) {
                    Some((_, segments)) => push_segments(&mut out, segments, ident.span()),
                    None => out.push(TokenTree::Ident(ident)),
                }
            }
            other => out.push(other),
        }
    }
    out.into_iter().collect()
}

/// Whether `out` ends with `::`.
fn after_path_separator(out: &[TokenTree]) -> bool {
    matches!(
        out,
        [
            ..,
            TokenTree::Punct(first),
            TokenTree::Punct(second)
        ] if first.as_char() == ':' && first.spacing() == Spacing::Joint && second.as_char() == ':'
    )
}

/// Pushes `segments` joined by `::`, each spanned at `span`.
fn push_segments(out: &mut Vec<TokenTree>, segments: &[String], span: Span) {
    for (index, segment) in segments.iter().enumerate() {
        if index > 0 {
            let mut joint = Punct::new(':', Spacing::Joint);
            joint.set_span(span);
            let mut alone = Punct::new(':', Spacing::Alone);
            alone.set_span(span);
            out.push(TokenTree::Punct(joint));
            out.push(TokenTree::Punct(alone));
        }
        out.push(TokenTree::Ident(Ident::new(segment, span)));
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::rewrite;

    #[test]
    fn paths_after_a_separator_are_rewritten_everywhere_and_nothing_else() {
        let tokens = quote! {
            impl ::outbox_core::Category for T {
                const ID: ::outbox_core::CategoryId = outbox_core::CategoryId(1);
                fn f() { ::outbox_testkit::__private::run::<T, _, _>() }
            }
        };
        let targets = [
            (
                "outbox_core",
                vec!["outbox".to_owned(), "__core".to_owned()],
            ),
            ("outbox_testkit", vec!["renamed_kit".to_owned()]),
        ];
        let rewritten = rewrite(tokens, &targets).to_string();
        let expected = quote! {
            impl ::outbox::__core::Category for T {
                const ID: ::outbox::__core::CategoryId = outbox_core::CategoryId(1);
                fn f() { ::renamed_kit::__private::run::<T, _, _>() }
            }
        };
        assert_eq!(rewritten, expected.to_string());
    }

    #[test]
    fn a_group_keeps_its_delimiter() {
        let tokens = quote!([::outbox_core::X]);
        let targets = [("outbox_core", vec!["o".to_owned(), "__core".to_owned()])];
        assert_eq!(
            rewrite(tokens, &targets).to_string(),
            quote!([::o::__core::X]).to_string()
        );
    }
}
