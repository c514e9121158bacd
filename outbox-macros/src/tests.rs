//! Snapshots of the expansions: each macro's expansion function, run through
//! [`common::expand`](crate::common::expand) on a representative input, pretty-printed with
//! `prettyplease` and compared with a committed file in `src/snapshots/`. Each snapshot's
//! header (`description`) shows the input as the user writes it.
//!
//! A stale snapshot fails the test with a diff. After changing an expansion on purpose,
//! re-bless every snapshot with
//!
//! ```text
//! INSTA_UPDATE=always cargo test -p outbox-macros
//! ```
//!
//! (no `cargo-insta` needed; with it, `cargo insta test -p outbox-macros --review`), then read
//! the diff of `outbox-macros/src/snapshots/` before committing it: the snapshots are the
//! reviewed contract of what users' crates compile. Under `CI=true` insta writes nothing and
//! a missing or stale snapshot fails.

use proc_macro2::TokenStream;
use quote::quote;

use crate::common::{self, Expansion};
use crate::{category, handler, model, scope};

/// The expansion of `#[attribute(args)] item`, as the compiler gets it, pretty-printed.
fn expand(expansion: Expansion, args: &TokenStream, item: &TokenStream) -> String {
    let output = common::expand(args.clone(), item.clone(), expansion);
    let file: syn::File = syn::parse2(output.clone()).unwrap_or_else(|error| {
        panic!("the expansion is not a list of items ({error}):\n{output}")
    });
    prettyplease::unparse(&file)
}

/// `#[attribute(args)]` on `item`, as a user writes it: the snapshot's description.
fn input(attribute: &str, args: &TokenStream, item: &TokenStream) -> String {
    let file: syn::File = syn::parse2(item.clone()).expect("the input item parses");
    let args = if args.is_empty() {
        String::new()
    } else {
        format!("({args})")
    };
    format!("#[{attribute}{args}]\n{}", prettyplease::unparse(&file))
}

/// Compares the expansion of `#[attribute(args)] item` with the snapshot `name`, and returns
/// it for further checks.
fn check(
    name: &str,
    attribute: &str,
    expansion: Expansion,
    args: &TokenStream,
    item: &TokenStream,
) -> String {
    let expanded = expand(expansion, args, item);
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_description(input(attribute, args, item));
    settings.bind(|| insta::assert_snapshot!(name, expanded));
    expanded
}

/// Checks an expansion that succeeds: the user's item comes first, unchanged, and nothing
/// reports an error.
fn check_ok(
    name: &str,
    attribute: &str,
    expansion: Expansion,
    args: &TokenStream,
    item: &TokenStream,
) {
    let expanded = check(name, attribute, expansion, args, item);
    let user_item = input("", &TokenStream::new(), item);
    let user_item = user_item.strip_prefix("#[]\n").expect("no attribute");
    assert!(
        expanded.starts_with(user_item),
        "the expansion does not start with the user's item:\n{expanded}"
    );
    assert!(!expanded.contains("compile_error"), "{expanded}");
}

/// Checks an expansion that fails: the user's item, then exactly one `compile_error!` saying
/// `message`.
fn check_error(
    name: &str,
    attribute: &str,
    expansion: Expansion,
    args: &TokenStream,
    item: &TokenStream,
    message: &str,
) {
    let output = common::expand(args.clone(), item.clone(), expansion);
    let file: syn::File = syn::parse2(output).expect("the error expansion parses");
    let (user_item, error) = match &file.items[..] {
        [user_item, syn::Item::Macro(error)] => (user_item, error),
        other => panic!("expected the user's item and one `compile_error!`, got {other:#?}"),
    };
    assert_eq!(
        *user_item,
        syn::parse2::<syn::Item>(item.clone()).expect("the input item parses"),
        "the user's item is kept as it is"
    );
    assert!(
        error.mac.path.is_ident("compile_error")
            || error
                .mac
                .path
                .segments
                .last()
                .is_some_and(|last| last.ident == "compile_error"),
        "not a `compile_error!`: {error:#?}"
    );
    let reported: syn::LitStr = error.mac.parse_body().expect("one message");
    assert!(
        reported.value().contains(message),
        "expected {message:?} in {:?}",
        reported.value()
    );
    check(name, attribute, expansion, args, item);
}

// Scopes.

#[test]
fn scope() {
    check_ok(
        "scope",
        "outbox_scope",
        scope::expand,
        &quote!(id = 1),
        &quote!(
            struct Organization;
        ),
    );
}

#[test]
fn scope_with_name() {
    check_ok(
        "scope_with_name",
        "outbox_scope",
        scope::expand,
        &quote!(id = 2, name = "audit"),
        &quote!(
            pub struct AuditLog;
        ),
    );
}

// Categories.

#[test]
fn category() {
    check_ok(
        "category",
        "outbox_category",
        category::expand,
        &quote!(scope = Organization, id = 10),
        &quote! {
            #[derive(Serialize, Deserialize)]
            pub struct ProjectUpdate {
                pub name: String,
            }
        },
    );
}

#[test]
fn category_without_coalescing() {
    check_ok(
        "category_without_coalescing",
        "outbox_category",
        category::expand,
        &quote!(scope = crate::scopes::AuditLog, id = 11, coalesce = false),
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct AuditEntry {
                action: String,
            }
        },
    );
}

#[test]
fn category_no_op() {
    check_ok(
        "category_no_op",
        "outbox_category",
        category::expand,
        &quote!(scope = Organization, id = 12, no_op),
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct CacheHint;
        },
    );
}

#[test]
fn category_with_name() {
    check_ok(
        "category_with_name",
        "outbox_category",
        category::expand,
        &quote!(scope = Organization, id = 13, name = "project.renamed"),
        &quote! {
            #[derive(Serialize, Deserialize)]
            enum Renamed {
                To(String),
            }
        },
    );
}

// Replicated models.

#[test]
fn model_local() {
    check_ok(
        "model_local",
        "replicated_model",
        model::expand,
        &quote!(
            scope = Organization,
            id = 20,
            table = "projects",
            shard = organization_id
        ),
        &quote! {
            #[derive(Serialize, Deserialize)]
            pub struct Project {
                pub id: i64,
                pub organization_id: i64,
                pub name: String,
                pub archived: bool,
                pub deleted: Option<bool>,
            }
        },
    );
}

#[test]
fn model_fan_out() {
    check_ok(
        "model_fan_out",
        "replicated_model",
        model::expand,
        &quote!(
            scope = Organization,
            id = 21,
            name = "member",
            table = "app.members",
            shard = org,
            key = member_id,
            tombstone = MemberTombstone,
            fan_out
        ),
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct Member {
                member_id: i32,
                org: i32,
                r#type: String,
            }
        },
    );
}

// Handlers.

#[test]
fn handler_of_a_category() {
    check_ok(
        "handler_of_a_category",
        "outbox_handler",
        handler::expand,
        &TokenStream::new(),
        &quote! {
            async fn record_audit(delivery: Delivery<AuditEntry>) -> Result<(), std::io::Error> {
                audit(delivery.payload.action);
                Ok(())
            }
        },
    );
}

#[test]
fn handler_of_a_category_with_context() {
    check_ok(
        "handler_of_a_category_with_context",
        "outbox_handler",
        handler::expand,
        &TokenStream::new(),
        &quote! {
            pub async fn replicate_project(
                update: Delivery<crate::ProjectUpdate>,
                cx: &mut HandlerContext<'_>,
            ) -> Result<(), BoxError> {
                cx.state::<Seen>().ok_or("no Seen state")?.push(update.payload.name);
                Ok(())
            }
        },
    );
}

#[test]
fn handler_of_replications() {
    check_ok(
        "handler_of_replications",
        "outbox_handler",
        handler::expand,
        &TokenStream::new(),
        &quote! {
            async fn replicate_project(replication: Replication<Project>) -> Result<(), BoxError> {
                upsert(&replication.object).await
            }
        },
    );
}

#[test]
fn handler_of_deletions() {
    check_ok(
        "handler_of_deletions",
        "outbox_handler",
        handler::expand,
        &TokenStream::new(),
        &quote! {
            async fn delete_member(
                deletion: Deletion<Member>,
                cx: &mut HandlerContext<'_>,
            ) -> Result<(), BoxError> {
                remove(cx, deletion.object_identifier).await
            }
        },
    );
}

// Mistakes: the user's item is kept, followed by exactly one `compile_error!`.

#[test]
fn error_unknown_key() {
    check_error(
        "error_unknown_key",
        "outbox_category",
        category::expand,
        &quote!(scope = Organization, id = 10, colour = "red"),
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct ProjectUpdate {
                name: String,
            }
        },
        "unknown key `colour` for `#[outbox_category]`",
    );
}

#[test]
fn error_missing_scope() {
    check_error(
        "error_missing_scope",
        "outbox_category",
        category::expand,
        &quote!(id = 10),
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct ProjectUpdate {
                name: String,
            }
        },
        "missing `scope = ...`",
    );
}

#[test]
fn error_missing_shard_field() {
    check_error(
        "error_missing_shard_field",
        "replicated_model",
        model::expand,
        &quote!(
            scope = Organization,
            id = 20,
            table = "projects",
            shard = org_id
        ),
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct Project {
                id: i64,
                organization_id: i64,
            }
        },
        "`Project` has no field `org_id`",
    );
}

#[test]
fn error_handler_not_async() {
    check_error(
        "error_handler_not_async",
        "outbox_handler",
        handler::expand,
        &TokenStream::new(),
        &quote! {
            fn record_audit(delivery: Delivery<AuditEntry>) -> Result<(), BoxError> {
                Ok(())
            }
        },
        "an outbox handler must be an `async fn`",
    );
}
