//! Snapshots of the expansions: each macro's expansion function, run through
//! [`common::expand`](crate::common::expand) on a representative input, pretty-printed with
//! `prettyplease` and compared with a committed file in `src/snapshots/`. Each snapshot's
//! header (`description`) shows the input as the user writes it.
//!
//! A stale or missing snapshot fails its test with a diff (and, outside CI, leaves the new
//! expansion beside it as `<name>.snap.new`, ignored by git). After changing an expansion on
//! purpose, re-bless every snapshot with
//!
//! ```text
//! INSTA_UPDATE=always cargo test -p outbox-macros
//! ```
//!
//! which needs no `cargo-insta` (with it installed, `cargo insta review` accepts the
//! `.snap.new` files one by one instead). Then read `git diff outbox-macros/src/snapshots/`
//! before committing: the snapshots are the reviewed record of what users' crates compile.
//! A renamed or removed test leaves its old `.snap` file behind: delete it by hand. Under
//! `CI=true` insta writes nothing, so a stale snapshot can only fail there.

use proc_macro2::TokenStream;
use quote::quote;

use crate::common::{self, Macro};
use crate::{category, handler, model, scope, test_attr};

/// The expansion of `#[attribute(args)] item`, as the compiler gets it, pretty-printed.
fn expand(expansion: &Macro, args: &str, item: &TokenStream) -> String {
    let output = common::expand(tokens(args), item, expansion);
    let file: syn::File = syn::parse2(output.clone()).unwrap_or_else(|error| {
        panic!("the expansion is not a list of items ({error}):\n{output}")
    });
    unparse(file)
}

fn tokens(args: &str) -> TokenStream {
    args.parse().expect("the arguments are tokens")
}

/// `file` pretty-printed, with the bodies of `inventory::submit! { .. }` (which `prettyplease`
/// prints as a flat run of tokens) laid out as the expressions they are.
fn unparse(mut file: syn::File) -> String {
    let mut bodies = Vec::new();
    for item in &mut file.items {
        match item {
            syn::Item::Macro(item) => format_body(&mut item.mac, &mut bodies),
            syn::Item::Const(item) => {
                if let syn::Expr::Block(block) = &mut *item.expr {
                    for statement in &mut block.block.stmts {
                        match statement {
                            syn::Stmt::Macro(statement) => {
                                format_body(&mut statement.mac, &mut bodies);
                            }
                            syn::Stmt::Item(syn::Item::Macro(item)) => {
                                format_body(&mut item.mac, &mut bodies);
                            }
                            _ => {}
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let mut text = prettyplease::unparse(&file);
    for (placeholder, body) in bodies {
        let line_start = text[..text.find(&placeholder).expect("placeholder printed")]
            .rfind('\n')
            .map_or(0, |newline| newline + 1);
        let indent = text[line_start..]
            .chars()
            .take_while(|c| *c == ' ')
            .collect::<String>();
        let body = body
            .lines()
            .map(|line| format!("{indent}{line}"))
            .collect::<Vec<_>>()
            .join("\n");
        text = text.replacen(&format!("{indent}{placeholder}"), &body, 1);
    }
    text
}

/// Replaces the body of `inventory::submit! { <expression> }` by a placeholder, and records
/// the expression pretty-printed.
fn format_body(mac: &mut syn::Macro, bodies: &mut Vec<(String, String)>) {
    if mac
        .path
        .segments
        .last()
        .is_none_or(|last| last.ident != "submit")
    {
        return;
    }
    let Ok(expr) = mac.parse_body::<syn::Expr>() else {
        return;
    };
    let placeholder = format!("__submitted_{}", bodies.len());
    let printed = prettyplease::unparse(&syn::parse_quote!(const _: () = #expr;));
    let printed = printed
        .strip_prefix("const _: () = ")
        .and_then(|rest| rest.strip_suffix(";\n"))
        .expect("a const item, as printed by prettyplease")
        .to_owned();
    mac.tokens = tokens(&placeholder);
    bodies.push((placeholder, printed));
}

/// `#[attribute(args)]` on `item`, as a user writes it: the snapshot's description.
fn input(attribute: &str, args: &str, item: &TokenStream) -> String {
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
fn check(name: &str, attribute: &str, expansion: &Macro, args: &str, item: &TokenStream) -> String {
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
fn check_ok(name: &str, attribute: &str, expansion: &Macro, args: &str, item: &TokenStream) {
    let expanded = check(name, attribute, expansion, args, item);
    let file: syn::File = syn::parse_str(&expanded).expect("the expansion parses");
    assert_eq!(
        file.items.first(),
        Some(&syn::parse2::<syn::Item>(item.clone()).expect("the input item parses")),
        "the expansion starts with the user's item, unchanged"
    );
    assert!(!expanded.contains("compile_error"), "{expanded}");
}

/// Checks an expansion that fails: the user's item, then exactly one `compile_error!` saying
/// `message`, then only the macro's stand-in items (no further error).
fn check_error(
    name: &str,
    attribute: &str,
    expansion: &Macro,
    args: &str,
    item: &TokenStream,
    message: &str,
) {
    let output = common::expand(tokens(args), item, expansion);
    let file: syn::File = syn::parse2(output).expect("the error expansion parses");
    let (user_item, error, stand_ins) = match &file.items[..] {
        [user_item, syn::Item::Macro(error), stand_ins @ ..] => (user_item, error, stand_ins),
        other => panic!("expected the user's item and one `compile_error!`, got {other:#?}"),
    };
    assert!(
        stand_ins
            .iter()
            .all(|item| !matches!(item, syn::Item::Macro(_))),
        "only stand-in items follow the error: {stand_ins:#?}"
    );
    assert_eq!(
        *user_item,
        syn::parse2::<syn::Item>(item.clone()).expect("the input item parses"),
        "the user's item is kept as it is"
    );
    assert!(
        error
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
        &scope::MACRO,
        "id = 1",
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
        &scope::MACRO,
        r#"id = 2, name = "audit""#,
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
        &category::MACRO,
        "scope = Organization, id = 10",
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
        &category::MACRO,
        "scope = crate::scopes::AuditLog, id = 11, coalesce = false",
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct AuditEntry {
                action: String,
            }
        },
    );
}

#[test]
fn category_with_a_dead_letter_policy() {
    check_ok(
        "category_with_a_dead_letter_policy",
        "outbox_category",
        &category::MACRO,
        "scope = Organization, id = 13, max_attempts = 5",
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct Webhook {
                url: String,
            }
        },
    );
}

#[test]
fn category_no_op() {
    check_ok(
        "category_no_op",
        "outbox_category",
        &category::MACRO,
        "scope = Organization, id = 12, no_op",
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
        &category::MACRO,
        r#"scope = Organization, id = 13, name = "project.renamed""#,
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
        &model::MACRO,
        r#"scope = Organization, id = 20, table = "projects", shard = organization_id"#,
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
        &model::MACRO,
        r#"scope = Organization, id = 21, name = "member", table = "app.members", shard = org, key = member_id, tombstone = MemberTombstone, fan_out"#,
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

#[test]
fn model_with_a_replication_version_and_destinations() {
    check_ok(
        "model_with_a_replication_version_and_destinations",
        "replicated_model",
        &model::MACRO,
        r#"scope = Organization, id = 21, table = "members", shard = org, key = member_id, fan_out, destinations = Member::regions, replication_version = 3"#,
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct Member {
                member_id: i32,
                org: i32,
            }
        },
    );
}

#[test]
fn error_replication_version_zero() {
    check_error(
        "error_replication_version_zero",
        "replicated_model",
        &model::MACRO,
        r#"scope = Organization, id = 20, table = "projects", shard = organization_id, replication_version = 0"#,
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct Project {
                id: i64,
                organization_id: i64,
            }
        },
        "`replication_version` is a whole number from 1",
    );
}

#[test]
fn error_destinations_of_a_local_model() {
    check_error(
        "error_destinations_of_a_local_model",
        "replicated_model",
        &model::MACRO,
        r#"scope = Organization, id = 20, table = "projects", shard = organization_id, destinations = regions"#,
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct Project {
                id: i64,
                organization_id: i64,
            }
        },
        "`destinations = ...` names where a fan-out model's rows go: it needs `fan_out`",
    );
}

// Handlers.

#[test]
fn handler_of_a_category() {
    check_ok(
        "handler_of_a_category",
        "outbox_handler",
        &handler::MACRO,
        "",
        &quote! {
            async fn record_audit(delivery: Delivery<AuditEntry>) -> Result<(), std::io::Error> {
                audit(delivery.payload.action);
                Ok(())
            }
        },
    );
}

#[test]
fn handler_of_a_category_with_arguments() {
    check_ok(
        "handler_of_a_category_with_arguments",
        "outbox_handler",
        &handler::MACRO,
        "",
        &quote! {
            pub async fn replicate_project(
                update: Delivery<crate::ProjectUpdate>,
                State(seen): State<Seen>,
                mut conn: Connection<'_, PgConnection>,
            ) -> Result<(), BoxError> {
                seen.push(update.payload.name);
                insert(&mut conn).await
            }
        },
    );
}

#[test]
fn error_handler_taking_the_context() {
    check_error(
        "error_handler_taking_the_context",
        "outbox_handler",
        &handler::MACRO,
        "",
        &quote! {
            async fn replicate_project(
                update: Delivery<ProjectUpdate>,
                cx: &mut HandlerContext<'_>,
            ) -> Result<(), BoxError> {
                Ok(())
            }
        },
        "not `&mut HandlerContext<'_>`",
    );
}

#[test]
fn handler_of_replications() {
    check_ok(
        "handler_of_replications",
        "outbox_handler",
        &handler::MACRO,
        "",
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
        &handler::MACRO,
        "",
        &quote! {
            async fn delete_member(
                deletion: Deletion<Member>,
                State(regions): State<Regions>,
            ) -> Result<(), BoxError> {
                regions.remove(deletion.object_identifier).await
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
        &category::MACRO,
        r#"scope = Organization, id = 10, colour = "red""#,
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
        &category::MACRO,
        "id = 10",
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
        &model::MACRO,
        r#"scope = Organization, id = 20, table = "projects", shard = org_id"#,
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
        &handler::MACRO,
        "",
        &quote! {
            fn record_audit(delivery: Delivery<AuditEntry>) -> Result<(), BoxError> {
                Ok(())
            }
        },
        "an outbox handler must be an `async fn`",
    );
}

// Tests with a database: `#[outbox_testkit::test]`, which takes the function's place.

/// The expansion of `#[outbox_test(args)] item`, pretty-printed, compared with the snapshot
/// `name`.
fn check_test(name: &str, args: &str, item: &TokenStream) -> String {
    let output = test_attr::expand(tokens(args), item);
    let file: syn::File = syn::parse2(output.clone()).unwrap_or_else(|error| {
        panic!("the expansion is not a list of items ({error}):\n{output}")
    });
    let expanded = unparse(file);
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_description(input("outbox_testkit::test", args, item));
    settings.bind(|| insta::assert_snapshot!(name, expanded));
    expanded
}

/// Checks an expansion that succeeds: a `#[test]` of the function's name and attributes,
/// holding the function, otherwise unchanged, then the check of the argument's type outside
/// `cargo test`; no error.
fn check_test_ok(name: &str, args: &str, item: &TokenStream) {
    let expanded = check_test(name, args, item);
    let file: syn::File =
        syn::parse2(test_attr::expand(tokens(args), item)).expect("the expansion parses");
    let mut user: syn::ItemFn = syn::parse2(item.clone()).expect("the input is a function");
    let (test, check) = match &file.items[..] {
        [syn::Item::Fn(test), syn::Item::Const(check)] => (test, check),
        other => panic!("expected a `#[test]` and a check, got {other:#?}"),
    };
    assert_eq!(
        test.sig.ident, user.sig.ident,
        "the `#[test]` has the function's name"
    );
    assert!(test.sig.inputs.is_empty() && test.sig.asyncness.is_none());
    assert_eq!(test.sig.output, user.sig.output, "and its return type");
    assert_eq!(
        test.attrs[0],
        syn::parse_quote!(#[::core::prelude::v1::test])
    );
    assert_eq!(test.attrs[1..], user.attrs, "and its attributes");
    assert_eq!(test.vis, user.vis, "and its visibility");
    user.attrs.clear();
    user.vis = syn::Visibility::Inherited;
    assert_eq!(
        test.block.stmts.first(),
        Some(&syn::Stmt::Item(syn::Item::Fn(user))),
        "the `#[test]` holds the function, without its attributes"
    );
    assert_eq!(check.attrs, [syn::parse_quote!(#[cfg(not(test))])]);
    assert!(!expanded.contains("compile_error"), "{expanded}");
}

/// Checks an expansion that fails: the user's function as it is, then one `compile_error!`
/// for each of `messages`, in order.
fn check_test_error(name: &str, args: &str, item: &TokenStream, messages: &[&str]) {
    let output = test_attr::expand(tokens(args), item);
    let file: syn::File = syn::parse2(output).expect("the error expansion parses");
    let (user_item, errors) = file.items.split_first().expect("the user's item");
    assert_eq!(
        *user_item,
        syn::parse2::<syn::Item>(item.clone()).expect("the input item parses"),
        "the user's item is kept as it is"
    );
    let reported: Vec<String> = errors
        .iter()
        .map(|error| match error {
            syn::Item::Macro(error)
                if error
                    .mac
                    .path
                    .segments
                    .last()
                    .is_some_and(|last| last.ident == "compile_error") =>
            {
                error
                    .mac
                    .parse_body::<syn::LitStr>()
                    .expect("one message")
                    .value()
            }
            other => panic!("not a `compile_error!`: {other:#?}"),
        })
        .collect();
    assert_eq!(reported.len(), messages.len(), "{reported:#?}");
    for (reported, message) in reported.iter().zip(messages) {
        assert!(
            reported.contains(message),
            "expected {message:?} in {reported:?}"
        );
    }
    check_test(name, args, item);
}

#[test]
fn test_with_a_database() {
    check_test_ok(
        "test_with_a_database",
        "",
        &quote! {
            async fn writes_an_outbox(db: PgTestDatabase) {
                write(db.pool()).await;
            }
        },
    );
}

#[test]
fn test_with_options() {
    check_test_ok(
        "test_with_options",
        r#"flavor = "current_thread", migrations = false"#,
        &quote! {
            /// Starts empty.
            #[should_panic(expected = "no outbox")]
            pub(crate) async fn starts_empty(
                mut db: outbox_testkit::sqlite::SqliteTestDatabase,
            ) -> Result<(), sqlx::Error> {
                count(&mut db).await?;
                Ok(())
            }
        },
    );
}

#[test]
fn error_test_not_async() {
    check_test_error(
        "error_test_not_async",
        "",
        &quote! {
            fn writes_an_outbox(db: PgTestDatabase) {}
        },
        &["a test under `#[outbox_testkit::test]` must be an `async fn`"],
    );
}

#[test]
fn error_test_mistakes_reported_together() {
    check_test_error(
        "error_test_mistakes_reported_together",
        r#"flavour = "current_thread", migrations = false, flavor = "single""#,
        &quote! {
            #[tokio::test]
            fn two_databases(pg: PgTestDatabase, sqlite: SqliteTestDatabase) {}
        },
        &[
            "unknown key `flavour` for `#[outbox_testkit::test]`: expected `flavor` or \
             `migrations`",
            "`flavor` is \"multi_thread\" (the default) or \"current_thread\"",
            "a test under `#[outbox_testkit::test]` must be an `async fn`",
            "`#[outbox_testkit::test]` makes the function a `#[test]` already",
            "take one argument, `db: PgTestDatabase`, `db: MySqlTestDatabase` or `db: SqliteTestDatabase`",
        ],
    );
}

/// `#[outbox_categories(args)] item`, pretty-printed.
fn expand_categories(args: &str, item: &TokenStream) -> String {
    let output = crate::categories::expand(tokens(args), item);
    let file: syn::File = syn::parse2(output.clone()).unwrap_or_else(|error| {
        panic!("the expansion is not a list of items ({error}):\n{output}")
    });
    unparse(file)
}

#[test]
fn category_enum() {
    let item = quote! {
        enum OrgEvent {
            #[category(id = 1)]
            Renamed(Renamed),
            /// Kept.
            #[category(id = 2, name = "member_added", coalesce = false)]
            MemberAdded(events::MemberAdded),
        }
    };
    let expanded = expand_categories("scope = Organization", &item);
    let file: syn::File = syn::parse_str(&expanded).expect("the expansion parses");
    let syn::Item::Enum(enumeration) = &file.items[0] else {
        panic!("the enum comes first:\n{expanded}")
    };
    assert!(
        enumeration
            .variants
            .iter()
            .all(|variant| variant.attrs.iter().all(|a| !a.path().is_ident("category"))),
        "the `#[category]` attributes are consumed, the others kept:\n{expanded}"
    );
    assert!(!expanded.contains("compile_error"), "{expanded}");
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_description(input("outbox_categories", "scope = Organization", &item));
    settings.bind(|| insta::assert_snapshot!("category_enum", expanded));
}

#[test]
fn category_enum_mistakes_are_reported_together() {
    let item = quote! {
        enum OrgEvent {
            #[category(id = 1)]
            Renamed(Renamed),
            #[category(id = 1, colour = "red")]
            MemberAdded(MemberAdded),
            Archived,
            Deleted(Deleted),
        }
    };
    let output = crate::categories::expand(tokens(""), &item).to_string();
    for message in [
        "missing `scope = ...`",
        "unknown key `colour`",
        "variant `Archived` holds no payload",
        "variant `Deleted` has no category id",
    ] {
        assert!(output.contains(message), "{message}: {output}");
    }
    assert!(
        output.contains("impl :: outbox_core :: handler :: Deliverable for OrgEvent"),
        "a stand-in keeps the enum's handlers quiet: {output}"
    );
}

#[test]
fn error_sink_and_no_op() {
    check_error(
        "error_sink_and_no_op",
        "outbox_category",
        &category::MACRO,
        "scope = Organization, id = 10, no_op, sink = NatsSink",
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct ProjectUpdate {
                name: String,
            }
        },
        "a category with a `sink` has a handler: it cannot be `no_op` too",
    );
}

#[test]
fn category_with_a_sink() {
    let expanded = check(
        "category_with_a_sink",
        "outbox_category",
        &category::MACRO,
        "scope = Organization, id = 10, coalesce = false, sink = outbox_nats::NatsSink",
        &quote! {
            #[derive(Serialize, Deserialize)]
            struct OrderPlaced {
                order: i64,
            }
        },
    );
    assert!(
        expanded.contains("sink_from_state_declared::<OrderPlaced, outbox_nats::NatsSink>"),
        "{expanded}"
    );
}
