//! Attribute macros for **outbox**, re-exported by `outbox-core` (feature `macros`, on by
//! default): use them as `outbox_core::outbox_category` and so on.
//!
//! - `#[outbox_scope(id = 1)]` on a unit struct declares a scope.
//! - `#[outbox_category(scope = Organization, id = 2)]` on a payload type declares a category
//!   carrying that payload (`coalesce = false` for event-style categories, `no_op` for one that
//!   needs no handler, `name = "..."` to override the snake-case name).
//! - `#[outbox_handler]` on `async fn f(delivery: Delivery<C>) -> Result<(), E>` (optionally
//!   taking `cx: &mut HandlerContext<'_>` second) registers the handler of category `C`.
//!
//! Each declaration is registered with `inventory`; `Registry::discover()` collects them at
//! start-up and refuses what the compiler cannot see (duplicates across crates, categories
//! without handlers, handlers of undeclared categories). Within one crate, a scope or category
//! id, or a category name, used twice is a compile error.

use heck::ToSnakeCase;
use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned};
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{
    FnArg, GenericArgument, Ident, Item, ItemFn, LitBool, LitInt, LitStr, Path, PathArguments,
    ReturnType, Type, TypePath,
};

/// Declares a scope: `#[outbox_scope(id = 1)]` on a unit struct.
///
/// Options: `id` (required: the stable small integer stored in every row of the scope),
/// `name` (defaults to the type's name in snake case).
#[proc_macro_attribute]
pub fn outbox_scope(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(args, item, scope)
}

/// Declares a category on its payload type:
/// `#[outbox_category(scope = Organization, id = 2)]`.
///
/// Options: `scope` (required, exactly one), `id` (required: the stable integer stored in
/// every row), `name` (defaults to the type's name in snake case), `coalesce = false` (deliver
/// every message in order instead of the newest per object), `no_op` (needs no handler).
#[proc_macro_attribute]
pub fn outbox_category(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(args, item, category)
}

/// Registers an `async fn` as the handler of the category its `Delivery<C>` argument names.
#[proc_macro_attribute]
pub fn outbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(args, item, handler)
}

/// Runs an expansion; on error, keeps the user's item so that one mistake is one error.
fn expand(
    args: TokenStream,
    item: TokenStream,
    expansion: fn(TokenStream2, &Item) -> syn::Result<TokenStream2>,
) -> TokenStream {
    let item_tokens = TokenStream2::from(item);
    let parsed: Item = match syn::parse2(item_tokens.clone()) {
        Ok(item) => item,
        Err(error) => return error.to_compile_error().into(),
    };
    match expansion(args.into(), &parsed) {
        Ok(generated) => quote!(#item_tokens #generated).into(),
        Err(error) => {
            let error = error.to_compile_error();
            quote!(#item_tokens #error).into()
        }
    }
}

/// The name and generics-freedom of a scope or category type.
fn plain_type(item: &Item, what: &str) -> syn::Result<Ident> {
    let (ident, generics) = match item {
        Item::Struct(item) => (&item.ident, &item.generics),
        Item::Enum(item) => (&item.ident, &item.generics),
        other => {
            return Err(syn::Error::new(
                other.span(),
                format!("an outbox {what} is declared on a struct or an enum"),
            ));
        }
    };
    if !generics.params.is_empty() {
        return Err(syn::Error::new(
            generics.span(),
            format!("an outbox {what} is a plain type: it cannot have generic parameters"),
        ));
    }
    Ok(ident.clone())
}

/// `file!()`, `line!()` and `column!()` of the user's token.
fn location(span: Span) -> TokenStream2 {
    quote_spanned! {span=>
        ::outbox_core::__private::SourceLocation {
            file: ::core::file!(),
            line: ::core::line!(),
            column: ::core::column!(),
        }
    }
}

/// A `macro_rules!` exported at the crate root under a name made of `parts`: a second one
/// with the same name anywhere in the crate is a compile error pointing at `span`.
fn unique_in_crate(parts: &str, span: Span) -> TokenStream2 {
    let name: String = parts
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let marker = Ident::new(&format!("{name}_must_be_unique_in_this_crate"), span);
    quote! {
        #[doc(hidden)]
        #[macro_export]
        macro_rules! #marker { () => {}; }
    }
}

fn integer<T>(lit: &LitInt, what: &str) -> syn::Result<T>
where
    T: std::str::FromStr + std::fmt::Display + Bounded,
    T::Err: std::fmt::Display,
{
    lit.base10_parse::<T>().map_err(|_| {
        syn::Error::new(
            lit.span(),
            format!("{what} must be an integer from {} to {}", T::MIN, T::MAX),
        )
    })
}

trait Bounded: Sized {
    const MIN: Self;
    const MAX: Self;
}

impl Bounded for i16 {
    const MIN: Self = i16::MIN;
    const MAX: Self = i16::MAX;
}

impl Bounded for i32 {
    const MIN: Self = i32::MIN;
    const MAX: Self = i32::MAX;
}

fn duplicate(key: &Ident) -> syn::Error {
    syn::Error::new(key.span(), format!("`{key}` is given twice"))
}

/// Parses `key = value` into `slot`, refusing a second one.
fn set_once<T: syn::parse::Parse>(
    slot: &mut Option<T>,
    meta: &syn::meta::ParseNestedMeta<'_>,
    key: &Ident,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(duplicate(key));
    }
    *slot = Some(meta.value()?.parse()?);
    Ok(())
}

fn scope(args: TokenStream2, item: &Item) -> syn::Result<TokenStream2> {
    let ident = plain_type(item, "scope")?;
    let mut id: Option<LitInt> = None;
    let mut name: Option<LitStr> = None;
    syn::meta::parser(|meta| {
        let key = meta.path.require_ident()?;
        if key == "id" {
            set_once(&mut id, &meta, key)?;
        } else if key == "name" {
            set_once(&mut name, &meta, key)?;
        } else {
            return Err(meta.error(format!(
                "unknown key `{key}` for `#[outbox_scope]`: expected `id` or `name`"
            )));
        }
        Ok(())
    })
    .parse2(args)?;
    let id_lit = id.ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "missing `id = ...`: a scope needs a stable id, e.g. `#[outbox_scope(id = 1)]`",
        )
    })?;
    let id: i16 = integer(&id_lit, "a scope id")?;
    let name =
        name.unwrap_or_else(|| LitStr::new(&ident.to_string().to_snake_case(), ident.span()));
    let at = location(ident.span());
    let marker = unique_in_crate(&format!("outbox_scope_id_{id}"), id_lit.span());
    Ok(quote! {
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
        #marker
    })
}

fn category(args: TokenStream2, item: &Item) -> syn::Result<TokenStream2> {
    let ident = plain_type(item, "category")?;
    let mut scope: Option<Path> = None;
    let mut id: Option<LitInt> = None;
    let mut name: Option<LitStr> = None;
    let mut coalesce: Option<LitBool> = None;
    let mut no_op = false;
    syn::meta::parser(|meta| {
        let key = meta.path.require_ident()?;
        if key == "scope" {
            if scope.is_some() {
                return Err(syn::Error::new(
                    key.span(),
                    "a category belongs to exactly one scope: `scope` is given twice",
                ));
            }
            let value: Type = meta.value()?.parse()?;
            match value {
                Type::Path(TypePath { qself: None, path }) => scope = Some(path),
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
            }
        } else if key == "id" {
            set_once(&mut id, &meta, key)?;
        } else if key == "name" {
            set_once(&mut name, &meta, key)?;
        } else if key == "coalesce" {
            set_once(&mut coalesce, &meta, key)?;
        } else if key == "no_op" {
            if no_op {
                return Err(duplicate(key));
            }
            no_op = true;
        } else {
            return Err(meta.error(format!(
                "unknown key `{key}` for `#[outbox_category]`: expected `scope`, `id`, `name`, \
                 `coalesce` or `no_op`"
            )));
        }
        Ok(())
    })
    .parse2(args)?;

    let scope = scope.ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "missing `scope = ...`: every category belongs to exactly one scope, e.g. \
             `#[outbox_category(scope = Organization, id = 1)]`",
        )
    })?;
    let id_lit = id.ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "missing `id = ...`: a category needs a stable id, e.g. \
             `#[outbox_category(scope = Organization, id = 1)]`",
        )
    })?;
    let id: i32 = integer(&id_lit, "a category id")?;
    let name =
        name.unwrap_or_else(|| LitStr::new(&ident.to_string().to_snake_case(), ident.span()));
    let coalesce = coalesce.is_none_or(|lit| lit.value);
    let at = location(ident.span());
    let id_marker = unique_in_crate(&format!("outbox_category_id_{id}"), id_lit.span());
    let name_marker = unique_in_crate(
        &format!("outbox_category_name_{}", name.value()),
        name.span(),
    );
    let scope_span = scope.span();
    let scope_assoc = quote_spanned!(scope_span=> type Scope = #scope;);
    let payload_assoc = quote_spanned!(ident.span()=> type Payload = Self;);
    Ok(quote! {
        impl ::outbox_core::Category for #ident {
            #scope_assoc
            #payload_assoc
            const ID: ::outbox_core::CategoryId = ::outbox_core::CategoryId(#id);
            const NAME: &'static str = #name;
            const COALESCE: bool = #coalesce;
        }
        ::outbox_core::__private::inventory::submit! {
            ::outbox_core::__private::CategoryDeclaration {
                id: ::outbox_core::CategoryId(#id),
                name: #name,
                scope: <#ident as ::outbox_core::Category>::SCOPE_ID,
                scope_name: <#ident as ::outbox_core::Category>::SCOPE_NAME,
                coalesce: #coalesce,
                no_op: #no_op,
                at: #at,
            }
        }
        #id_marker
        #name_marker
    })
}

/// The `C` of `Delivery<C>`.
fn delivery_category(ty: &Type) -> Option<&Type> {
    let Type::Path(TypePath { qself: None, path }) = ty else {
        return None;
    };
    let last = path.segments.last()?;
    if last.ident != "Delivery" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.iter().collect::<Vec<_>>().as_slice() {
        [GenericArgument::Type(category)] => Some(category),
        _ => None,
    }
}

fn is_handler_context(ty: &Type) -> bool {
    let Type::Reference(reference) = ty else {
        return false;
    };
    if reference.mutability.is_none() {
        return false;
    }
    matches!(&*reference.elem, Type::Path(TypePath { qself: None, path })
        if path.segments.last().is_some_and(|last| last.ident == "HandlerContext"))
}

#[allow(clippy::needless_pass_by_value)] // the shape every expansion shares
fn handler(args: TokenStream2, item: &Item) -> syn::Result<TokenStream2> {
    if !args.is_empty() {
        return Err(syn::Error::new(
            args.span(),
            "`#[outbox_handler]` takes no arguments: the category is the `C` of the function's \
             `Delivery<C>` argument",
        ));
    }
    let Item::Fn(ItemFn { sig, .. }) = item else {
        return Err(syn::Error::new(
            item.span(),
            "`#[outbox_handler]` goes on an `async fn`",
        ));
    };
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span(),
            "an outbox handler must be an `async fn`",
        ));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new(
            sig.generics.span(),
            "an outbox handler cannot have generic parameters",
        ));
    }
    let usage = "an outbox handler takes `delivery: Delivery<YourCategory>`, optionally followed \
                 by `cx: &mut HandlerContext<'_>`";
    let mut inputs = sig.inputs.iter();
    let delivery_type = match inputs.next() {
        Some(FnArg::Typed(first)) => {
            delivery_category(&first.ty).ok_or_else(|| syn::Error::new(first.ty.span(), usage))?;
            &first.ty
        }
        Some(FnArg::Receiver(receiver)) => {
            return Err(syn::Error::new(
                receiver.span(),
                "an outbox handler is a free function, not a method",
            ));
        }
        None => return Err(syn::Error::new(sig.paren_token.span.join(), usage)),
    };
    let takes_context = match inputs.next() {
        None => false,
        Some(FnArg::Typed(second)) if is_handler_context(&second.ty) => true,
        Some(other) => return Err(syn::Error::new(other.span(), usage)),
    };
    if let Some(extra) = inputs.next() {
        return Err(syn::Error::new(extra.span(), usage));
    }

    let function = &sig.ident;
    let call = if takes_context {
        quote!(#function(delivery, cx))
    } else {
        quote!({
            let _ = cx;
            #function(delivery)
        })
    };
    let output_span = match &sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => sig.paren_token.span.join(),
    };
    let into_result = quote_spanned! {output_span=>
        ::outbox_core::__private::HandlerOutput::into_result(#call.await)
    };
    let handler_type = format_ident!("__OutboxHandler_{}", function);
    let at = location(function.span());
    Ok(quote! {
        const _: () = {
            #[allow(non_camel_case_types)]
            struct #handler_type;

            impl ::outbox_core::__private::DeclaredHandler<#delivery_type> for #handler_type {
                async fn handle(
                    &self,
                    delivery: #delivery_type,
                    cx: &mut ::outbox_core::HandlerContext<'_>,
                ) -> ::core::result::Result<(), ::outbox_core::BoxError> {
                    #into_result
                }
            }

            ::outbox_core::__private::inventory::submit! {
                ::outbox_core::__private::HandlerDeclaration {
                    register: |builder, at| {
                        builder.handle_declared(::outbox_core::__private::Declared(#handler_type), at)
                    },
                    at: #at,
                }
            }
        };
    })
}
