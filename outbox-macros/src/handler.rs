//! `#[outbox_handler]` on an `async fn`: a handler type making the function's arguments from
//! each call's context and calling it, registered with
//! `inventory` under the category or model its first argument names.

use heck::ToUpperCamelCase;
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, Ident, Item, ItemFn, PathArguments, ReturnType, Type, TypePath};

use crate::common::{self, Macro, hidden};

const USAGE: &str = "an outbox handler takes its delivery first, `delivery: \
                     Delivery<YourCategory>` (or `Replication<YourModel>` or \
                     `Deletion<YourModel>` for a replicated model), then any of `State<T>` and \
                     `Connection<'_, T>`";

const CONTEXT_MOVED: &str = "an outbox handler takes what it needs as arguments, not \
                             `&mut HandlerContext<'_>`: `State(value): State<T>` for a value \
                             given to `Registry::builder().state(..)`, `Connection<'_, T>` for \
                             the claiming transaction's connection";

/// Whether `ty` is `Delivery<C>`, `Replication<M>` or `Deletion<M>`.
fn is_delivery(ty: &Type) -> bool {
    let Type::Path(TypePath { qself: None, path }) = ty else {
        return false;
    };
    let Some(last) = path.segments.last() else {
        return false;
    };
    if !["Delivery", "Replication", "Deletion"]
        .iter()
        .any(|kind| last.ident == kind)
    {
        return false;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return false;
    };
    args.args.len() == 1 && matches!(args.args.first(), Some(GenericArgument::Type(_)))
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

/// `#[outbox_handler]`.
pub(crate) const MACRO: Macro = Macro {
    expand,
    fallback: common::no_fallback,
};

#[allow(clippy::needless_pass_by_value)] // the shape every expansion shares
pub(crate) fn expand(args: TokenStream, item: &Item) -> syn::Result<TokenStream> {
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
    let mut inputs = sig.inputs.iter();
    let delivery_type = match inputs.next() {
        Some(FnArg::Typed(first)) if is_delivery(&first.ty) => &first.ty,
        Some(FnArg::Typed(first)) => return Err(syn::Error::new(first.ty.span(), USAGE)),
        Some(FnArg::Receiver(receiver)) => {
            return Err(syn::Error::new(
                receiver.span(),
                "an outbox handler is a free function, not a method",
            ));
        }
        None => return Err(syn::Error::new(sig.paren_token.span.join(), USAGE)),
    };
    // Every later argument is made from the call's context: its type implements
    // `FromContext` (checked by the compiler, at the argument's type).
    let mut arguments = Vec::new();
    for input in inputs {
        match input {
            FnArg::Typed(argument) if is_handler_context(&argument.ty) => {
                return Err(syn::Error::new_spanned(&argument.ty, CONTEXT_MOVED));
            }
            FnArg::Typed(argument) => arguments.push(&*argument.ty),
            FnArg::Receiver(receiver) => return Err(syn::Error::new(receiver.span(), USAGE)),
        }
    }

    // The expansion's own names, out of reach of the user's (a handler may be named `cx`).
    let delivery = Ident::new("delivery", Span::mixed_site());
    let cx = Ident::new("cx", Span::mixed_site());
    let requirements = Ident::new("requirements", Span::mixed_site());
    let names: Vec<Ident> = (0..arguments.len())
        .map(|index| Ident::new(&format!("argument{index}"), Span::mixed_site()))
        .collect();
    let requires = arguments.iter().map(|ty| {
        quote_spanned! {ty.span()=>
            <#ty as ::outbox_core::handler::FromContext<'_>>::requires(#requirements);
        }
    });
    let extract = arguments.iter().zip(&names).map(|(ty, name)| {
        quote_spanned! {ty.span()=>
            let #name = match <#ty as ::outbox_core::handler::FromContext<'_>>::from_context(#cx) {
                ::core::result::Result::Ok(argument) => argument,
                ::core::result::Result::Err(error) => {
                    return ::core::result::Result::Err(::core::convert::Into::into(error));
                }
            };
        }
    });
    let function = &sig.ident;
    // The function is taken as a value, as a handler is: lints that judge an `async fn` by
    // its body alone (`clippy::unused_async`) leave it alone.
    let handler = Ident::new("handler", Span::mixed_site());
    let call = quote!({
        let #handler = #function;
        #handler(#delivery #(, #names)*)
    });
    let output_span = match &sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => sig.paren_token.span.join(),
    };
    let into_result = quote_spanned! {output_span=>
        ::outbox_core::handler::HandlerOutput::into_result(#call.await)
    };
    let handler_type = format_ident!(
        "OutboxHandler{}",
        function.unraw().to_string().to_upper_camel_case()
    );
    let at = common::location(function.span());
    let (unused_requirements, unused_cx) = if arguments.is_empty() {
        (quote!(let _ = #requirements;), quote!(let _ = #cx;))
    } else {
        (TokenStream::new(), TokenStream::new())
    };
    Ok(hidden(&quote! {
        struct #handler_type;

        impl ::outbox_core::handler::Handler<#delivery_type> for #handler_type {
            fn requires(&self, #requirements: &mut ::outbox_core::handler::Requirements) {
                #unused_requirements
                #(#requires)*
            }

            fn call(
                &self,
                #delivery: #delivery_type,
                #cx: &mut ::outbox_core::handler::HandlerContext<'_>,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<(), ::outbox_core::BoxError>,
            > + ::core::marker::Send {
                #unused_cx
                async move {
                    #(#extract)*
                    #into_result
                }
            }
        }

        ::outbox_core::__private::inventory::submit! {
            ::outbox_core::__private::HandlerDeclaration {
                register: |builder, at| {
                    <#delivery_type as ::outbox_core::__private::HandlerKind>::register(
                        builder,
                        #handler_type,
                        at,
                    )
                },
                at: #at,
            }
        }
    }))
}
