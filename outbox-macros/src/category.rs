//! `#[outbox_category(scope = .., id = ..)]`: a `Category` impl on the payload type and its
//! registration; and what `#[replicated_model]` shares with it.

use heck::ToSnakeCase;
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{Ident, Item, LitBool, LitInt, LitStr, Path, Type, TypePath};

use crate::common::{
    Errors, Macro, hidden, integer, location, plain_type, set_flag, set_once, unique_in_crate,
    unknown_key,
};

/// The arguments every category declaration takes: `scope`, `id` and `name`.
#[derive(Default)]
pub(crate) struct CategoryArgs {
    scope: Option<Path>,
    id: Option<LitInt>,
    name: Option<LitStr>,
    max_attempts: Option<LitInt>,
}

/// A category's identity, validated.
pub(crate) struct CategoryIdentity {
    pub(crate) ident: Ident,
    pub(crate) scope: Path,
    pub(crate) id: i32,
    pub(crate) id_span: Span,
    pub(crate) name: LitStr,
    /// The dead-letter policy: `Some(n)` sets a failing group aside after `n` attempts.
    pub(crate) max_attempts: Option<u32>,
}

/// `max_attempts = n`: an integer from 1; 0 would set every failing group aside before its
/// first attempt, and leaving the key out is how to say "never".
pub(crate) fn max_attempts(lit: &LitInt) -> syn::Result<u32> {
    match lit.base10_parse::<u32>() {
        Ok(0) => Err(syn::Error::new(
            lit.span(),
            "`max_attempts` must be at least 1: leave it out to keep a failing group at the \
             head of its shard, retried until it succeeds (the default)",
        )),
        Ok(attempts) => Ok(attempts),
        Err(_) => Err(syn::Error::new(
            lit.span(),
            format!("`max_attempts` must be an integer from 1 to {}", u32::MAX),
        )),
    }
}

impl CategoryArgs {
    /// Takes `scope`, `id`, `name` or `max_attempts`; `Ok(false)` for any other key.
    pub(crate) fn take(&mut self, key: &Ident, meta: &ParseNestedMeta<'_>) -> syn::Result<bool> {
        if key == "scope" {
            if self.scope.is_some() {
                return Err(syn::Error::new(
                    key.span(),
                    "a category belongs to exactly one scope: `scope` is given twice",
                ));
            }
            let value: Type = meta.value()?.parse()?;
            self.scope = Some(match value {
                Type::Path(TypePath { qself: None, path }) => path,
                Type::Tuple(tuple) => {
                    return Err(syn::Error::new(
                        tuple.span(),
                        "a category belongs to exactly one scope: name one scope type",
                    ));
                }
                other => {
                    return Err(syn::Error::new(
                        other.span(),
                        "expected the scope's type, e.g. `scope = Organization`",
                    ));
                }
            });
        } else if key == "id" {
            set_once(&mut self.id, meta, key)?;
        } else if key == "name" {
            set_once(&mut self.name, meta, key)?;
        } else if key == "max_attempts" {
            set_once(&mut self.max_attempts, meta, key)?;
        } else {
            return Ok(false);
        }
        Ok(true)
    }

    /// The scope, if given.
    pub(crate) fn scope(self) -> Option<Path> {
        self.scope
    }

    /// Checks that `scope` and `id` were given; `example` shows the attribute written right.
    /// Reports every mistake at once: each missing key, and those `errors` gathered before.
    pub(crate) fn finish(
        self,
        ident: Ident,
        example: &str,
        mut errors: Errors,
    ) -> syn::Result<CategoryIdentity> {
        let scope = errors.required(self.scope, || {
            syn::Error::new(
                Span::call_site(),
                format!(
                    "missing `scope = ...`: every category belongs to exactly one scope, e.g. \
                     `{example}`"
                ),
            )
        });
        let id_lit = errors.required(self.id, || {
            syn::Error::new(
                Span::call_site(),
                format!("missing `id = ...`: a category needs a stable id, e.g. `{example}`"),
            )
        });
        let id: Option<i32> = id_lit
            .as_ref()
            .and_then(|lit| errors.keep(integer(lit, "a category id")));
        let max_attempts = match &self.max_attempts {
            Some(lit) => errors.keep(max_attempts(lit)),
            None => None,
        };
        errors.finish()?;
        let (Some(scope), Some(id_lit), Some(id)) = (scope, id_lit, id) else {
            unreachable!("a missing value is an error, reported above");
        };
        let name = self
            .name
            .unwrap_or_else(|| LitStr::new(&ident.to_string().to_snake_case(), ident.span()));
        Ok(CategoryIdentity {
            ident,
            scope,
            id,
            id_span: id_lit.span(),
            name,
            max_attempts,
        })
    }
}

/// What a category declaration generates besides its identity.
pub(crate) struct CategoryItems {
    /// The payload type.
    pub(crate) payload: TokenStream,
    pub(crate) coalesce: bool,
    pub(crate) no_op: bool,
    /// An expression of type `Option<ModelTable>`.
    pub(crate) model: TokenStream,
    /// A replicated model's replication version (0 for any other category).
    pub(crate) replication_version: u32,
    /// More items to generate beside the `Category` impl.
    pub(crate) extra: TokenStream,
    /// The type the `Category` is implemented for, when it is not the identity's own name
    /// (a path, in a category enum's variant).
    pub(crate) target: Option<TokenStream>,
}

impl CategoryIdentity {
    /// The `Category` impl, its registration with `inventory`, and the crate-wide markers that
    /// make a second use of the id or name a compile error.
    pub(crate) fn items(&self, items: CategoryItems) -> TokenStream {
        let Self {
            ident,
            scope,
            id,
            id_span,
            name,
            max_attempts,
        } = self;
        let CategoryItems {
            payload,
            coalesce,
            no_op,
            model,
            replication_version,
            extra,
            target,
        } = items;
        let target = target.unwrap_or_else(|| quote!(#ident));
        let at = location(ident.span());
        let id_marker = unique_in_crate("outbox_category_id", &id.to_string(), *id_span);
        let name_marker = unique_in_crate("outbox_category_name", &name.value(), name.span());
        let scope_assoc = quote_spanned!(scope.span()=> type Scope = #scope;);
        let type_name = ident.to_string();
        let policy = match max_attempts {
            Some(attempts) => quote!(const MAX_ATTEMPTS: ::core::option::Option<u32> =
                ::core::option::Option::Some(#attempts);),
            None => TokenStream::new(),
        };
        let items = hidden(&quote! {
            impl ::outbox_core::Category for #target {
                #scope_assoc
                #payload
                const ID: ::outbox_core::CategoryId = ::outbox_core::CategoryId(#id);
                const NAME: &'static str = #name;
                const COALESCE: bool = #coalesce;
                #policy
            }
            ::outbox_core::__private::inventory::submit! {
                ::outbox_core::__private::CategoryDeclaration {
                    identity: ::outbox_core::model::CategoryIdentity::declared::<#target>(
                        #type_name,
                    ),
                    no_op: #no_op,
                    model: #model,
                    replication_version: #replication_version,
                    at: #at,
                }
            }
            #extra
        });
        quote!(#items #id_marker #name_marker)
    }
}

/// `#[outbox_category]`.
pub(crate) const MACRO: Macro = Macro { expand, fallback };

pub(crate) fn expand(args: TokenStream, item: &Item) -> syn::Result<TokenStream> {
    let ident = plain_type(item, "category")?;
    let mut common = CategoryArgs::default();
    let mut coalesce: Option<LitBool> = None;
    let mut no_op = false;
    let mut sink: Option<Type> = None;
    let mut errors = Errors::default();
    syn::meta::parser(|meta| {
        let key = meta.path.require_ident()?;
        if common.take(key, &meta)? {
            Ok(())
        } else if key == "coalesce" {
            set_once(&mut coalesce, &meta, key)
        } else if key == "no_op" {
            set_flag(&mut no_op, key)
        } else if key == "sink" {
            set_once(&mut sink, &meta, key)
        } else {
            unknown_key(
                &meta,
                format!(
                    "unknown key `{key}` for `#[outbox_category]`: expected `scope`, `id`, \
                     `name`, `coalesce`, `max_attempts`, `no_op` or `sink`"
                ),
                &mut errors,
            )
        }
    })
    .parse2(args)?;
    if let (true, Some(sink)) = (no_op, &sink) {
        return Err(syn::Error::new_spanned(
            sink,
            "a category with a `sink` has a handler: it cannot be `no_op` too",
        ));
    }
    let identity = common.finish(
        ident,
        "#[outbox_category(scope = Organization, id = 1)]",
        errors,
    )?;
    let payload = quote_spanned!(identity.ident.span()=> type Payload = Self;);
    let extra = sink.map_or_else(TokenStream::new, |sink| {
        let ident = &identity.ident;
        let at = location(sink.span());
        quote! {
            ::outbox_core::__private::inventory::submit! {
                ::outbox_core::__private::HandlerDeclaration {
                    register: |builder, at| {
                        builder.sink_from_state_declared::<#ident, #sink>(at)
                    },
                    at: #at,
                }
            }
        }
    });
    Ok(identity.items(CategoryItems {
        payload,
        coalesce: coalesce.is_none_or(|lit| lit.value),
        no_op,
        model: quote!(::core::option::Option::None),
        replication_version: 0,
        extra,
        target: None,
    }))
}

/// After a mistake in `#[outbox_category]`: a stand-in `Category` impl, so that the type's
/// uses elsewhere report nothing more.
pub(crate) fn fallback(item: &Item) -> TokenStream {
    let Ok(ident) = plain_type(item, "category") else {
        return TokenStream::new();
    };
    stand_in(&ident, &quote!(Self))
}

/// A `Category` impl of no scope or id, for a type whose declaration failed.
pub(crate) fn stand_in(ident: &Ident, payload: &TokenStream) -> TokenStream {
    hidden(&quote! {
        impl ::outbox_core::Category for #ident {
            type Scope = ::outbox_core::__private::Undeclared;
            type Payload = #payload;
            const ID: ::outbox_core::CategoryId = ::outbox_core::CategoryId(0);
            const NAME: &'static str = "";
        }
    })
}
