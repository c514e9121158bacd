//! `#[outbox_handler]` on an `async fn`: a handler type calling the function, registered with
//! `inventory` under the category or model its first argument names.

use heck::ToUpperCamelCase;
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, Ident, Item, ItemFn, PathArguments, ReturnType, Type, TypePath};

use crate::common::{self, Macro, hidden};

const USAGE: &str = "an outbox handler takes `delivery: Delivery<YourCategory>` (or \
                     `Replication<YourModel>` or `Deletion<YourModel>` for a replicated model), \
                     optionally followed by `cx: &mut HandlerContext<'_>`";

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
    let takes_context = match inputs.next() {
        None => false,
        Some(FnArg::Typed(second)) if is_handler_context(&second.ty) => true,
        Some(other) => return Err(syn::Error::new(other.span(), USAGE)),
    };
    if let Some(extra) = inputs.next() {
        return Err(syn::Error::new(extra.span(), USAGE));
    }

    // The expansion's own names, out of reach of the user's (a handler may be named `cx`).
    let delivery = Ident::new("delivery", Span::mixed_site());
    let cx = Ident::new("cx", Span::mixed_site());
    let function = &sig.ident;
    // The function is taken as a value, as a handler is: lints that judge an `async fn` by
    // its body alone (`clippy::unused_async`) leave it alone.
    let handler = Ident::new("handler", Span::mixed_site());
    let call = if takes_context {
        quote!({
            let #handler = #function;
            #handler(#delivery, #cx)
        })
    } else {
        quote!({
            let #handler = #function;
            #handler(#delivery)
        })
    };
    let output_span = match &sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => sig.paren_token.span.join(),
    };
    let into_result = quote_spanned! {output_span=>
        ::outbox_core::__private::HandlerOutput::into_result(#call.await)
    };
    let handler_type = format_ident!(
        "OutboxHandler{}",
        function.unraw().to_string().to_upper_camel_case()
    );
    let at = common::location(function.span());
    let unused_cx = (!takes_context).then(|| quote!(let _ = #cx;));
    Ok(hidden(&quote! {
        struct #handler_type;

        impl ::outbox_core::__private::DeclaredHandler<#delivery_type> for #handler_type {
            fn handle(
                &self,
                #delivery: #delivery_type,
                #cx: &mut ::outbox_core::HandlerContext<'_>,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<(), ::outbox_core::BoxError>,
            > + ::core::marker::Send {
                #unused_cx
                async move { #into_result }
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
