//! What every expansion shares: error handling that keeps the user's item, source
//! locations, crate-wide uniqueness markers and argument parsing helpers.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Item, LitInt};

/// An attribute macro: its expansion, and what stands in for it when the expansion fails.
pub(crate) struct Macro {
    /// The attribute's arguments and the parsed item in, the generated items out.
    pub(crate) expand: fn(TokenStream, &Item) -> syn::Result<TokenStream>,
    /// After an error, what makes the item's uses elsewhere compile (nothing, by default).
    pub(crate) fallback: fn(&Item) -> TokenStream,
}

/// No stand-in.
pub(crate) fn no_fallback(_: &Item) -> TokenStream {
    TokenStream::new()
}

/// Runs a macro; on error, keeps the user's item (and the macro's stand-in for what it would
/// have generated) so that one mistake is one error.
pub(crate) fn expand(args: TokenStream, item: &TokenStream, r#macro: &Macro) -> TokenStream {
    let parsed: Item = match syn::parse2(item.clone()) {
        Ok(parsed) => parsed,
        Err(error) => return error.to_compile_error(),
    };
    match (r#macro.expand)(args, &parsed) {
        Ok(generated) => quote!(#item #generated),
        Err(error) => {
            let error = error.to_compile_error();
            let fallback = (r#macro.fallback)(&parsed);
            quote!(#item #error #fallback)
        }
    }
}

/// Wraps generated items in `const _: () = { .. };`, so they add no names to the user's module.
pub(crate) fn hidden(items: &TokenStream) -> TokenStream {
    quote! {
        const _: () = {
            #items
        };
    }
}

/// The name of a scope, category or model type, refusing generic parameters.
pub(crate) fn plain_type(item: &Item, what: &str) -> syn::Result<Ident> {
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
pub(crate) fn location(span: Span) -> TokenStream {
    quote_spanned! {span=>
        ::outbox_core::__private::SourceLocation {
            file: ::core::file!(),
            line: ::core::line!(),
            column: ::core::column!(),
        }
    }
}

/// A `macro_rules!` exported at the crate root under a name made of `kind` and `value`: a
/// second one with the same name anywhere in the crate is a compile error pointing at `span`.
pub(crate) fn unique_in_crate(kind: &str, value: &str, span: Span) -> TokenStream {
    let marker = Ident::new(
        &format!(
            "{kind}_{}_must_be_unique_in_this_crate",
            identifier_safe(value)
        ),
        span,
    );
    quote! {
        #[doc(hidden)]
        #[macro_export]
        #[allow(non_local_definitions)]
        macro_rules! #marker { () => {}; }
    }
}

/// `value` spelled with ASCII letters, digits and `_` only: any other character becomes
/// `_U<HEX>_` (`project.renamed` is `project_U2E_renamed`, apart from `project_renamed`).
fn identifier_safe(value: &str) -> String {
    let mut safe = String::with_capacity(value.len());
    for c in value.chars() {
        if c == '_' || c.is_ascii_alphanumeric() {
            safe.push(c);
        } else {
            safe.push_str(&format!("_U{:X}_", u32::from(c)));
        }
    }
    safe
}

/// Parses an integer literal into `T`, with the accepted range in the error.
pub(crate) fn integer<T>(lit: &LitInt, what: &str) -> syn::Result<T>
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

/// An integer type's range.
pub(crate) trait Bounded: Sized {
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

/// The error for a key given twice, at its second occurrence.
pub(crate) fn duplicate(key: &Ident) -> syn::Error {
    syn::Error::new(key.span(), format!("`{key}` is given twice"))
}

/// Parses `key = value` into `slot`, refusing a second one.
pub(crate) fn set_once<T: syn::parse::Parse>(
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

/// Sets a flag given as a bare key (`no_op`, `fan_out`), refusing a second one.
pub(crate) fn set_flag(flag: &mut bool, key: &Ident) -> syn::Result<()> {
    if *flag {
        return Err(duplicate(key));
    }
    *flag = true;
    Ok(())
}

/// Errors gathered along the way, reported together: each mistake at its own token.
#[derive(Default)]
pub(crate) struct Errors {
    errors: Option<syn::Error>,
    unknown_key: bool,
}

impl Errors {
    /// Adds an error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.errors {
            Some(first) => first.combine(error),
            None => self.errors = Some(error),
        }
    }

    /// The value of `result`, or `None` with its error kept.
    pub(crate) fn keep<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|error| self.push(error)).ok()
    }

    /// A required key's value, or `None` with `missing` kept as the error: unless an unknown
    /// key was given, most likely the same key misspelled, which is then the one error.
    pub(crate) fn required<T>(
        &mut self,
        value: Option<T>,
        missing: impl FnOnce() -> syn::Error,
    ) -> Option<T> {
        if value.is_none() && !self.unknown_key {
            self.push(missing());
        }
        value
    }

    /// Every error gathered, as one.
    pub(crate) fn finish(self) -> syn::Result<()> {
        self.errors.map_or(Ok(()), Err)
    }
}

/// Records an unknown key's error and skips its value (`key = value`), so that parsing goes
/// on to the keys after it.
pub(crate) fn unknown_key(
    meta: &syn::meta::ParseNestedMeta<'_>,
    message: String,
    errors: &mut Errors,
) -> syn::Result<()> {
    errors.push(meta.error(message));
    errors.unknown_key = true;
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<syn::Expr>()?;
    }
    Ok(())
}
