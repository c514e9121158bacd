//! `#[outbox_scope(id = ..)]`: a `Scope` impl and its registration.

use heck::ToSnakeCase;
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::parse::Parser;
use syn::{Item, LitInt, LitStr};

use crate::common::{
    self, Errors, Macro, hidden, integer, location, plain_type, set_once, unique_in_crate,
    unknown_key,
};

/// `#[outbox_scope]`.
pub(crate) const MACRO: Macro = Macro {
    expand,
    fallback: common::no_fallback,
};

pub(crate) fn expand(args: TokenStream, item: &Item) -> syn::Result<TokenStream> {
    let ident = plain_type(item, "scope")?;
    let mut id: Option<LitInt> = None;
    let mut name: Option<LitStr> = None;
    let mut errors = Errors::default();
    syn::meta::parser(|meta| {
        let key = meta.path.require_ident()?;
        if key == "id" {
            set_once(&mut id, &meta, key)
        } else if key == "name" {
            set_once(&mut name, &meta, key)
        } else {
            unknown_key(
                &meta,
                format!("unknown key `{key}` for `#[outbox_scope]`: expected `id` or `name`"),
                &mut errors,
            )
        }
    })
    .parse2(args)?;
    let id_lit = errors.required(id, || {
        syn::Error::new(
            Span::call_site(),
            "missing `id = ...`: a scope needs a stable id, e.g. `#[outbox_scope(id = 1)]`",
        )
    });
    errors.finish()?;
    let Some(id_lit) = id_lit else {
        unreachable!("a missing id is an error, reported above");
    };
    let id: i16 = integer(&id_lit, "a scope id")?;
    let name =
        name.unwrap_or_else(|| LitStr::new(&ident.to_string().to_snake_case(), ident.span()));
    let at = location(ident.span());
    let marker = unique_in_crate("outbox_scope_id", &id.to_string(), id_lit.span());
    let items = hidden(&quote! {
        impl ::outbox_core::Scope for #ident {
            const ID: ::outbox_core::ScopeId = ::outbox_core::ScopeId(#id);
            const NAME: &'static str = #name;
        }
        ::outbox_core::__private::inventory::submit! {
            ::outbox_core::__private::ScopeDeclaration {
                id: ::outbox_core::ScopeId(#id),
                name: #name,
                at: #at,
            }
        }
    });
    Ok(quote!(#items #marker))
}
