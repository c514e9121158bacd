//! `#[outbox_testkit::test]` on `async fn t(db: PgTestDatabase)` (or `MySqlTestDatabase`,
//! `SqliteTestDatabase`): a
//! `#[test]` that runs the function on a new tokio runtime with a new database of the type
//! its argument names, dropped afterwards.
//!
//! Unlike the declaration macros, whose items stand beside the user's (see
//! [`common::expand`]), this expansion takes the function's place: the `#[test]` takes its name
//! and its attributes and holds the function, otherwise unchanged. On error the function is
//! kept as it is, followed by the error.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, Item, ItemFn, LitBool, LitStr, Type};

use crate::common::{self, Errors, Macro, set_once, unknown_key};

const USAGE: &str = "`#[outbox_testkit::test]` hands the test a fresh database: take one \
                     argument, `db: PgTestDatabase`, `db: MySqlTestDatabase` or \
                     `db: SqliteTestDatabase`";

/// `#[outbox_testkit::test]`, run through [`expand`].
pub(crate) const MACRO: Macro = Macro {
    expand: expand_test,
    fallback: common::no_fallback,
};

/// Runs the macro: the generated `#[test]` in place of the function, or, on error, the
/// function as it is and the error.
pub(crate) fn expand(args: TokenStream, item: &TokenStream) -> TokenStream {
    let parsed: Item = match syn::parse2(item.clone()) {
        Ok(parsed) => parsed,
        Err(error) => return error.to_compile_error(),
    };
    match (MACRO.expand)(args, &parsed) {
        Ok(generated) => generated,
        Err(error) => {
            let error = error.to_compile_error();
            let fallback = (MACRO.fallback)(&parsed);
            quote!(#item #error #fallback)
        }
    }
}

/// The attribute's options.
struct Options {
    /// `MultiThread` or `CurrentThread`: the variant of `__private::Flavor`.
    flavor: Ident,
    migrations: bool,
}

fn options(args: TokenStream, errors: &mut Errors) -> syn::Result<Options> {
    let mut flavor: Option<LitStr> = None;
    let mut migrations: Option<LitBool> = None;
    syn::meta::parser(|meta| {
        let key = meta.path.require_ident()?;
        if key == "flavor" {
            set_once(&mut flavor, &meta, key)
        } else if key == "migrations" {
            set_once(&mut migrations, &meta, key)
        } else {
            unknown_key(
                &meta,
                format!(
                    "unknown key `{key}` for `#[outbox_testkit::test]`: expected `flavor` or \
                     `migrations`"
                ),
                errors,
            )
        }
    })
    .parse2(args)?;
    let flavor = match flavor {
        None => Ident::new("MultiThread", Span::call_site()),
        Some(lit) => match lit.value().as_str() {
            "multi_thread" => Ident::new("MultiThread", lit.span()),
            "current_thread" => Ident::new("CurrentThread", lit.span()),
            _ => {
                errors.push(syn::Error::new(
                    lit.span(),
                    "`flavor` is \"multi_thread\" (the default) or \"current_thread\"",
                ));
                Ident::new("MultiThread", lit.span())
            }
        },
    };
    Ok(Options {
        flavor,
        migrations: migrations.is_none_or(|lit| lit.value),
    })
}

/// The type of the function's one argument, the database; every mistake in the signature
/// kept in `errors`.
fn database_type<'a>(function: &'a ItemFn, errors: &mut Errors) -> Option<&'a Type> {
    let sig = &function.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span(),
            "a test under `#[outbox_testkit::test]` must be an `async fn`",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.push(syn::Error::new_spanned(
            &sig.generics,
            "a test under `#[outbox_testkit::test]` cannot have generic parameters",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        errors.push(syn::Error::new_spanned(variadic, USAGE));
    }
    for attr in &function.attrs {
        if attr
            .path()
            .segments
            .last()
            .is_some_and(|last| last.ident == "test")
        {
            errors.push(syn::Error::new_spanned(
                attr,
                "`#[outbox_testkit::test]` makes the function a `#[test]` already: remove this \
                 attribute",
            ));
        }
    }
    let mut inputs = sig.inputs.iter();
    let database = match inputs.next() {
        Some(FnArg::Typed(argument)) => Some(&*argument.ty),
        Some(FnArg::Receiver(receiver)) => {
            errors.push(syn::Error::new_spanned(
                receiver,
                "a test under `#[outbox_testkit::test]` is a free function, not a method",
            ));
            None
        }
        None => {
            errors.push(syn::Error::new(sig.paren_token.span.join(), USAGE));
            None
        }
    };
    for extra in inputs {
        errors.push(syn::Error::new_spanned(extra, USAGE));
    }
    database
}

#[allow(clippy::needless_pass_by_value)] // the shape every expansion shares
fn expand_test(args: TokenStream, item: &Item) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let options = options(args, &mut errors);
    let options = errors.keep(options);
    let Item::Fn(function) = item else {
        errors.push(syn::Error::new(
            item.span(),
            "`#[outbox_testkit::test]` goes on an `async fn` taking the test's database",
        ));
        errors.finish()?;
        unreachable!("an item other than a function is an error, reported above");
    };
    let database = database_type(function, &mut errors);
    errors.finish()?;
    let (Some(Options { flavor, migrations }), Some(database)) = (options, database) else {
        unreachable!("a missing option or argument is an error, reported above");
    };

    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let name = &sig.ident;
    let output = &sig.output;
    // Where the argument's type is wrong, the error points at it.
    let run = quote_spanned! {database.span()=>
        ::outbox_testkit::__private::run::<#database, _, _>
    };
    let check = quote_spanned! {database.span()=>
        ::outbox_testkit::__private::assert_test_database::<#database>()
    };
    Ok(quote! {
        #[::core::prelude::v1::test]
        #(#attrs)*
        #vis fn #name() #output {
            #sig #block
            #run(
                ::outbox_testkit::__private::Options {
                    flavor: ::outbox_testkit::__private::Flavor::#flavor,
                    migrations: #migrations,
                },
                #name,
            )
        }

        // The `#[test]` above exists only under `cargo test`: elsewhere (`cargo check` without
        // `--tests`), this reports a wrong argument type all the same.
        #[cfg(not(test))]
        const _: () = #check;
    })
}
