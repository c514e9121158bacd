//! `#[outbox_categories(scope = ..)]` on an enum: a scope's categories declared together, each
//! variant holding one category's payload and naming its id (`#[category(id = 1)]`). Each
//! payload type becomes a category (as with `#[outbox_category]`), and the enum what one
//! handler takes to `match` them all (`Delivery<TheEnum>`).

use heck::ToSnakeCase;
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{Attribute, Fields, Ident, Item, ItemEnum, LitBool, LitInt, LitStr, Path, Type};

use crate::category::{CategoryArgs, CategoryIdentity, CategoryItems};
use crate::common::{Errors, hidden, set_once, unknown_key};

const EXAMPLE: &str = "#[outbox_categories(scope = Organization)]";
const VARIANT_EXAMPLE: &str = "#[category(id = 1)]";

/// One variant, parsed: its name, its payload type, and its `#[category(..)]`.
struct Variant {
    ident: Ident,
    payload: Type,
    id: LitInt,
    name: LitStr,
    coalesce: bool,
    max_attempts: Option<u32>,
}

/// `#[outbox_categories]`: the enum without its variants' `#[category]` attributes, then what
/// it declares; or, after a mistake, the enum, the errors and stand-ins.
pub(crate) fn expand(args: TokenStream, item: &TokenStream) -> TokenStream {
    let mut item: Item = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(error) => return error.to_compile_error(),
    };
    let Item::Enum(enumeration) = &mut item else {
        let error = syn::Error::new(
            item.span(),
            "`#[outbox_categories]` goes on an enum whose variants each hold one category's \
             payload, e.g. `enum OrgEvent { #[category(id = 1)] Renamed(Renamed) }`",
        );
        let error = error.to_compile_error();
        return quote!(#item #error);
    };
    let attributes: Vec<Vec<Attribute>> = enumeration
        .variants
        .iter_mut()
        .map(|variant| {
            let (mine, others) = variant
                .attrs
                .drain(..)
                .partition(|attribute| attribute.path().is_ident("category"));
            variant.attrs = others;
            mine
        })
        .collect();
    match declare(args, enumeration, &attributes) {
        Ok(generated) => quote!(#enumeration #generated),
        Err(error) => {
            let error = error.to_compile_error();
            let fallback = fallback(enumeration);
            quote!(#enumeration #error #fallback)
        }
    }
}

/// Parses the arguments and variants, checks them together, and expands.
fn declare(
    args: TokenStream,
    enumeration: &ItemEnum,
    attributes: &[Vec<Attribute>],
) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let scope = parse_scope(args, &mut errors)?;
    if !enumeration.generics.params.is_empty() {
        errors.push(syn::Error::new(
            enumeration.generics.span(),
            "a category enum is a plain type: it cannot have generic parameters",
        ));
    }
    if enumeration.variants.is_empty() {
        errors.push(syn::Error::new(
            enumeration.ident.span(),
            "a category enum declares at least one category: add a variant \
             `#[category(id = 1)] Renamed(Renamed)`",
        ));
    }
    let variants: Vec<Variant> = enumeration
        .variants
        .iter()
        .zip(attributes)
        .filter_map(|(variant, attributes)| {
            let parsed = parse_variant(variant, attributes);
            errors.keep(parsed)
        })
        .collect();
    check_unique(&enumeration.ident, &variants, &mut errors);
    errors.finish()?;
    let Some(scope) = scope else {
        unreachable!("a missing scope is an error, reported above");
    };
    Ok(generate(&enumeration.ident, &scope, &variants))
}

/// `scope = ..`, the only argument.
fn parse_scope(args: TokenStream, errors: &mut Errors) -> syn::Result<Option<Path>> {
    let mut common = CategoryArgs::default();
    let mut misplaced = Vec::new();
    syn::meta::parser(|meta| {
        let key = meta.path.require_ident()?;
        if key == "scope" {
            common.take(key, &meta).map(|_| ())
        } else if key == "id" || key == "name" || key == "max_attempts" {
            misplaced.push(key.clone());
            unknown_key(
                &meta,
                format!(
                    "`{key}` belongs to each variant of a category enum: \
                     `#[category({key} = ..)]`"
                ),
                errors,
            )
        } else {
            unknown_key(
                &meta,
                format!("unknown key `{key}` for `#[outbox_categories]`: expected `scope`"),
                errors,
            )
        }
    })
    .parse2(args)?;
    let scope = common.scope();
    if scope.is_none() {
        errors.push(syn::Error::new(
            Span::call_site(),
            format!(
                "missing `scope = ...`: every category of a category enum belongs to its one \
                 scope, e.g. `{EXAMPLE}`"
            ),
        ));
    }
    Ok(scope)
}

/// A variant holding one payload, with its `#[category(id = .., name = .., coalesce = ..,
/// max_attempts = ..)]`.
fn parse_variant(variant: &syn::Variant, attributes: &[Attribute]) -> syn::Result<Variant> {
    let ident = variant.ident.clone();
    let payload = match &variant.fields {
        Fields::Unnamed(fields) if fields.unnamed.len() == 1 => fields.unnamed[0].ty.clone(),
        _ => {
            return Err(syn::Error::new(
                variant.span(),
                format!(
                    "variant `{ident}` holds no payload: each variant of a category enum holds \
                     its category's payload type, e.g. `{ident}({ident})`"
                ),
            ));
        }
    };
    let mut attributes = attributes.iter();
    let Some(attribute) = attributes.next() else {
        return Err(syn::Error::new(
            ident.span(),
            format!(
                "variant `{ident}` has no category id: add `{VARIANT_EXAMPLE}` (ids are stable: \
                 stored in every row)"
            ),
        ));
    };
    if let Some(second) = attributes.next() {
        return Err(syn::Error::new(
            second.span(),
            "`#[category(..)]` is given twice: give each key once, in one attribute",
        ));
    }
    let mut id: Option<LitInt> = None;
    let mut name: Option<LitStr> = None;
    let mut coalesce: Option<LitBool> = None;
    let mut max_attempts: Option<LitInt> = None;
    let mut errors = Errors::default();
    attribute.parse_nested_meta(|meta| {
        let key = meta.path.require_ident()?;
        if key == "id" {
            set_once(&mut id, &meta, key)
        } else if key == "name" {
            set_once(&mut name, &meta, key)
        } else if key == "coalesce" {
            set_once(&mut coalesce, &meta, key)
        } else if key == "max_attempts" {
            set_once(&mut max_attempts, &meta, key)
        } else {
            unknown_key(
                &meta,
                format!(
                    "unknown key `{key}` for `#[category]`: expected `id`, `name`, `coalesce` \
                     or `max_attempts`"
                ),
                &mut errors,
            )
        }
    })?;
    let max_attempts = match &max_attempts {
        Some(lit) => errors.keep(crate::category::max_attempts(lit)),
        None => None,
    };
    let id = errors.required(id, || {
        syn::Error::new(
            attribute.span(),
            format!(
                "missing `id = ...`: variant `{ident}` needs a stable id, e.g. `{VARIANT_EXAMPLE}`"
            ),
        )
    });
    if let Some(id) = &id {
        errors.keep(crate::common::integer::<i32>(id, "a category id"));
    }
    errors.finish()?;
    let Some(id) = id else {
        unreachable!("a missing id is an error, reported above");
    };
    let name =
        name.unwrap_or_else(|| LitStr::new(&ident.to_string().to_snake_case(), ident.span()));
    Ok(Variant {
        ident,
        payload,
        id,
        name,
        coalesce: coalesce.is_none_or(|lit| lit.value),
        max_attempts,
    })
}

/// Ids and names are unique within the enum: a second use is reported at its variant, naming
/// both.
fn check_unique(enumeration: &Ident, variants: &[Variant], errors: &mut Errors) {
    for (index, variant) in variants.iter().enumerate() {
        let earlier = &variants[..index];
        let id = variant.id.base10_parse::<i32>().ok();
        if let Some(first) = earlier
            .iter()
            .find(|first| id.is_some() && first.id.base10_parse::<i32>().ok() == id)
        {
            errors.push(syn::Error::new(
                variant.id.span(),
                format!(
                    "category id {} is used by both `{}` and `{}` in `{enumeration}`: each \
                     category needs an id of its own",
                    variant.id, first.ident, variant.ident
                ),
            ));
        }
        if let Some(first) = earlier
            .iter()
            .find(|first| first.name.value() == variant.name.value())
        {
            errors.push(syn::Error::new(
                variant.name.span(),
                format!(
                    "category name `{}` is used by both `{}` and `{}` in `{enumeration}`: give \
                     one another `name = \"..\"`",
                    variant.name.value(),
                    first.ident,
                    variant.ident
                ),
            ));
        }
    }
}

/// A category per variant, and the enum's `Deliverable` impl.
fn generate(enumeration: &Ident, scope: &Path, variants: &[Variant]) -> TokenStream {
    let mut categories = TokenStream::new();
    for variant in variants {
        let payload = &variant.payload;
        let identity = CategoryIdentity {
            ident: payload_name(payload).unwrap_or_else(|| variant.ident.clone()),
            scope: scope.clone(),
            id: variant.id.base10_parse().unwrap_or_default(),
            id_span: variant.id.span(),
            name: variant.name.clone(),
            max_attempts: variant.max_attempts,
        };
        categories.extend(identity.items(CategoryItems {
            payload: quote_spanned!(payload.span()=> type Payload = Self;),
            coalesce: variant.coalesce,
            no_op: false,
            model: quote!(::core::option::Option::None),
            replication_version: 0,
            extra: TokenStream::new(),
            target: Some(quote!(#payload)),
        }));
    }
    let specs = variants.iter().map(|variant| {
        let payload = &variant.payload;
        quote!(::outbox_core::model::CategoryIdentity::of::<#payload>())
    });
    let decodes = variants.iter().map(|variant| {
        let (ident, payload) = (&variant.ident, &variant.payload);
        quote! {
            if category == <#payload as ::outbox_core::Category>::ID {
                return <#payload as ::outbox_core::Payload>::from_json_str(payload)
                    .map(Self::#ident);
            }
        }
    });
    let name = enumeration.to_string();
    let deliverable = hidden(&quote! {
        impl ::outbox_core::handler::Deliverable for #enumeration {
            type Payload = Self;

            fn categories() -> ::std::vec::Vec<::outbox_core::model::CategoryIdentity> {
                ::std::vec::Vec::from([#(#specs),*])
            }

            fn decode(
                category: ::outbox_core::CategoryId,
                payload: &str,
            ) -> ::core::result::Result<Self, ::outbox_core::__private::JsonError> {
                #(#decodes)*
                ::core::result::Result::Err(::outbox_core::__private::not_in_enum(#name, category))
            }
        }
    });
    quote!(#categories #deliverable)
}

/// The name of a payload type written as a path: its last segment.
fn payload_name(payload: &Type) -> Option<Ident> {
    match payload {
        Type::Path(path) => path.path.segments.last().map(|last| last.ident.clone()),
        _ => None,
    }
}

/// After a mistake: the enum handles nothing (so that its handlers report nothing more), and
/// each payload type is a stand-in category.
fn fallback(enumeration: &ItemEnum) -> TokenStream {
    let ident = &enumeration.ident;
    let mut stand_ins = TokenStream::new();
    for variant in &enumeration.variants {
        if let Fields::Unnamed(fields) = &variant.fields
            && fields.unnamed.len() == 1
            && let Type::Path(path) = &fields.unnamed[0].ty
            && let Some(last) = path.path.get_ident()
        {
            stand_ins.extend(crate::category::stand_in(last, &quote!(Self)));
        }
    }
    if !enumeration.generics.params.is_empty() {
        return stand_ins;
    }
    let name = ident.to_string();
    let deliverable = hidden(&quote! {
        impl ::outbox_core::handler::Deliverable for #ident {
            type Payload = Self;

            fn categories() -> ::std::vec::Vec<::outbox_core::model::CategoryIdentity> {
                ::std::vec::Vec::new()
            }

            fn decode(
                category: ::outbox_core::CategoryId,
                _payload: &str,
            ) -> ::core::result::Result<Self, ::outbox_core::__private::JsonError> {
                ::core::result::Result::Err(::outbox_core::__private::not_in_enum(#name, category))
            }
        }
    });
    quote!(#stand_ins #deliverable)
}
