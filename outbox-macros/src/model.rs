//! `#[replicated_model(..)]`: a domain struct as its own category, with the `ReplicatedModel`
//! impl that tells the backends its table and the relay how to look it up.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{Expr, Field, Fields, Ident, Item, LitInt, LitStr, Type};

use crate::category::{CategoryArgs, CategoryItems};
use crate::common::{Errors, Macro, hidden, plain_type, set_flag, set_once, unknown_key};

const EXAMPLE: &str = "#[replicated_model(scope = Organization, id = 1, table = \"projects\", shard = organization_id)]";

/// The arguments of `#[replicated_model]`.
#[derive(Default)]
struct ModelArgs {
    category: CategoryArgs,
    table: Option<LitStr>,
    shard: Option<Ident>,
    key: Option<Ident>,
    tombstone: Option<Type>,
    fan_out: bool,
    replication_version: Option<LitInt>,
    destinations: Option<Expr>,
    errors: Errors,
}

impl ModelArgs {
    fn parse(args: TokenStream) -> syn::Result<Self> {
        let mut parsed = Self::default();
        syn::meta::parser(|meta| {
            let key = meta.path.require_ident()?;
            if parsed.category.take(key, &meta)? {
                Ok(())
            } else if key == "table" {
                set_once(&mut parsed.table, &meta, key)
            } else if key == "shard" {
                set_once(&mut parsed.shard, &meta, key)
            } else if key == "key" {
                set_once(&mut parsed.key, &meta, key)
            } else if key == "tombstone" {
                set_once(&mut parsed.tombstone, &meta, key)
            } else if key == "fan_out" {
                set_flag(&mut parsed.fan_out, key)
            } else if key == "replication_version" {
                set_once(&mut parsed.replication_version, &meta, key)
            } else if key == "destinations" {
                set_once(&mut parsed.destinations, &meta, key)
            } else {
                unknown_key(
                    &meta,
                    format!(
                        "unknown key `{key}` for `#[replicated_model]`: expected `scope`, `id`, \
                         `name`, `table`, `shard`, `key`, `tombstone`, `fan_out`, \
                         `destinations` or `replication_version`"
                    ),
                    &mut parsed.errors,
                )
            }
        })
        .parse2(args)?;
        Ok(parsed)
    }
}

/// Checks a table name: an SQL identifier, optionally qualified by a schema.
fn table_name(table: &LitStr) -> syn::Result<String> {
    let name = table.value();
    let valid = !name.is_empty()
        && name.split('.').count() <= 2
        && name.split('.').all(|part| {
            part.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    if valid {
        Ok(name)
    } else {
        Err(syn::Error::new(
            table.span(),
            "a table name is an SQL identifier of letters, digits and `_`, optionally \
             qualified by its schema: `projects` or `app.projects`",
        ))
    }
}

/// The field named `name`.
fn field<'a>(fields: &'a [&'a Field], name: &Ident) -> Option<&'a Field> {
    fields.iter().copied().find(|field| {
        field
            .ident
            .as_ref()
            .is_some_and(|ident| ident.unraw() == name.unraw())
    })
}

/// `field` as the identifier the outbox stores, type-checked at the field's type.
fn identifier(field: &Field) -> TokenStream {
    let ident = &field.ident;
    quote_spanned! {field.ty.span()=>
        ::outbox_core::Identifier::to_id(&self.#ident)
    }
}

/// `#[replicated_model]`.
pub(crate) const MACRO: Macro = Macro { expand, fallback };

pub(crate) fn expand(args: TokenStream, item: &Item) -> syn::Result<TokenStream> {
    let ident = plain_type(item, "replicated model")?;
    let Item::Struct(structure) = item else {
        return Err(syn::Error::new(
            ident.span(),
            "a replicated model is a struct with named fields, one per column",
        ));
    };
    let Fields::Named(named) = &structure.fields else {
        return Err(syn::Error::new(
            structure.fields.span(),
            "a replicated model is a struct with named fields, one per column",
        ));
    };
    let fields: Vec<&Field> = named.named.iter().collect();
    let ModelArgs {
        category,
        table,
        shard,
        key,
        tombstone,
        fan_out,
        replication_version,
        destinations,
        mut errors,
    } = ModelArgs::parse(args)?;
    let replication_version = match &replication_version {
        None => Some(1),
        Some(lit) => errors.keep(
            lit.base10_parse::<u32>()
                .ok()
                .filter(|version| *version >= 1)
                .ok_or_else(|| {
                    syn::Error::new(
                        lit.span(),
                        "`replication_version` is a whole number from 1: raise it when the \
                         model's replication changes, and start a backfill to it",
                    )
                }),
        ),
    };
    if let (Some(destinations), false) = (&destinations, fan_out) {
        errors.keep::<()>(Err(syn::Error::new(
            destinations.span(),
            "`destinations = ...` names where a fan-out model's rows go: it needs `fan_out`",
        )));
    }

    let table = errors
        .required(table, || {
            syn::Error::new(
                Span::call_site(),
                format!("missing `table = \"...\"`: the table holding the rows, e.g. `{EXAMPLE}`"),
            )
        })
        .and_then(|table| errors.keep(table_name(&table)));
    let shard_field = errors
        .required(shard, || {
            syn::Error::new(
                Span::call_site(),
                format!(
                    "missing `shard = <field>`: the field holding the shard identifier, e.g. \
                     `{EXAMPLE}`"
                ),
            )
        })
        .and_then(|shard| {
            errors.keep(field(&fields, &shard).ok_or_else(|| {
                syn::Error::new(
                    shard.span(),
                    format!(
                        "`{ident}` has no field `{shard}`: `shard = ...` names the field holding \
                         the shard identifier of its scope"
                    ),
                )
            }))
        });
    let key_field = errors.keep(match &key {
        Some(key) => field(&fields, key).ok_or_else(|| {
            syn::Error::new(
                key.span(),
                format!(
                    "`{ident}` has no field `{key}`: `key = ...` names the field holding its \
                     primary key"
                ),
            )
        }),
        None => field(&fields, &Ident::new("id", ident.span())).ok_or_else(|| {
            syn::Error::new(
                ident.span(),
                format!(
                    "`{ident}` has no `id` field: name the field holding its primary key with \
                     `key = <field>`"
                ),
            )
        }),
    });
    let identity = category.finish(ident, EXAMPLE, errors)?;
    let (Some(table), Some(shard_field), Some(key_field), Some(replication_version)) =
        (table, shard_field, key_field, replication_version)
    else {
        unreachable!("a missing value is an error, reported above");
    };
    let ident = &identity.ident;

    let column = |field: &Field| {
        field
            .ident
            .as_ref()
            .map(|ident| ident.unraw().to_string())
            .unwrap_or_default()
    };
    let columns: Vec<String> = fields.iter().map(|f| column(f)).collect();
    // Each column visited with its field's own type: what the backends bind and check.
    let field_types: Vec<&Type> = fields.iter().map(|f| &f.ty).collect();
    let visit_values = fields.iter().zip(&columns).map(|(field, column)| {
        let (ty, ident) = (&field.ty, &field.ident);
        quote_spanned! {ty.span()=>
            ::outbox_core::columns::ColumnVisitor::<#ty>::value(visitor, #column, &self.#ident);
        }
    });
    let visit_columns = fields.iter().zip(&columns).map(|(field, column)| {
        let ty = &field.ty;
        quote_spanned! {ty.span()=>
            ::outbox_core::columns::ColumnVisitor::<#ty>::column(visitor, #column);
        }
    });
    let key_column = column(key_field);
    let visit_key = {
        let (ty, ident) = (&key_field.ty, &key_field.ident);
        quote_spanned! {ty.span()=>
            ::outbox_core::columns::ColumnVisitor::<#ty>::value(visitor, #key_column, &self.#ident);
        }
    };
    let object_identifier = identifier(key_field);
    let key_type = &key_field.ty;
    let shard_identifier = identifier(shard_field);
    let (payload, tombstone) = match &tombstone {
        Some(ty) => (
            quote_spanned!(ty.span()=> type Payload = #ty;),
            quote_spanned!(ty.span()=> <#ty as ::core::convert::From<&Self>>::from(self)),
        ),
        None => (
            quote!(
                type Payload = ();
            ),
            TokenStream::new(),
        ),
    };
    let direction = if fan_out {
        quote!(::outbox_core::FanOutModel)
    } else {
        quote!(::outbox_core::LocalModel)
    };
    let backfill_destinations = destinations.map(|path| {
        quote_spanned! {path.span()=>
            fn backfill_destinations(
                &self,
            ) -> ::core::option::Option<::std::vec::Vec<::outbox_core::Destination>> {
                let destinations: fn(&Self) -> ::std::vec::Vec<::outbox_core::Destination> =
                    #path;
                ::core::option::Option::Some(destinations(self))
            }
        }
    });
    // The table is a constant of its own, which the registration names: a model that does not
    // implement `ReplicatedModel` (not serializable, say) is then reported once, at its impl.
    let model = quote! {
        const TABLE: ::outbox_core::replicated::ModelTable = ::outbox_core::replicated::ModelTable {
            table: #table,
            key: #key_column,
            columns: &[#(#columns),*],
        };

        impl<V: ?::core::marker::Sized #(+ ::outbox_core::columns::ColumnVisitor<#field_types>)*>
            ::outbox_core::columns::ModelColumns<V> for #ident
        {
            fn visit_values(&self, visitor: &mut V) {
                #(#visit_values)*
            }

            fn visit_columns(visitor: &mut V) {
                #(#visit_columns)*
            }

            fn visit_key(&self, visitor: &mut V) {
                #visit_key
            }
        }

        impl ::outbox_core::ReplicatedModel for #ident {
            const TABLE: ::outbox_core::replicated::ModelTable = TABLE;
            type Key = #key_type;

            fn object_identifier(&self) -> ::outbox_core::Id {
                #object_identifier
            }

            fn shard_identifier(&self) -> ::outbox_core::Id {
                #shard_identifier
            }

            fn tombstone(&self) -> <Self as ::outbox_core::Category>::Payload {
                #tombstone
            }

            const REPLICATION_VERSION: u32 = #replication_version;
            const FAN_OUT: bool = #fan_out;
            #backfill_destinations
        }
        impl #direction for #ident {}
    };
    Ok(identity.items(CategoryItems {
        payload,
        coalesce: true,
        no_op: false,
        model: quote!(::core::option::Option::Some(TABLE)),
        replication_version,
        extra: model,
        target: None,
    }))
}

/// After a mistake in `#[replicated_model]`: stand-in `Category` and `ReplicatedModel` impls,
/// so that the model's uses elsewhere report nothing more.
pub(crate) fn fallback(item: &Item) -> TokenStream {
    let Ok(ident) = plain_type(item, "replicated model") else {
        return TokenStream::new();
    };
    let category = crate::category::stand_in(&ident, &quote!(()));
    let model = hidden(&quote! {
        impl ::outbox_core::ReplicatedModel for #ident {
            const TABLE: ::outbox_core::replicated::ModelTable = ::outbox_core::replicated::ModelTable {
                table: "",
                key: "",
                columns: &[],
            };
            type Key = ::outbox_core::Id;

            fn object_identifier(&self) -> ::outbox_core::Id {
                ::outbox_core::Id::integer(0)
            }

            fn shard_identifier(&self) -> ::outbox_core::Id {
                ::outbox_core::Id::integer(0)
            }

            fn tombstone(&self) {}
        }
        impl ::outbox_core::LocalModel for #ident {}
        impl ::outbox_core::FanOutModel for #ident {}
        impl<V: ?::core::marker::Sized> ::outbox_core::columns::ModelColumns<V> for #ident {
            fn visit_values(&self, _: &mut V) {}
            fn visit_columns(_: &mut V) {}
            fn visit_key(&self, _: &mut V) {}
        }
    });
    quote!(#category #model)
}
