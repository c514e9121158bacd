//! The handler crate is a dependency in Cargo.toml, and this test never names it in source.
//!
//! `inventory` registrations live in the crate that submits them: a dependency no source code
//! references may not be linked into the binary, and its `#[outbox_handler]`s then vanish. The
//! registry must not let that pass silently: `Registry::discover()` either finds the handler
//! (the crate was linked after all) or refuses the category with
//! `RegistryProblem::MissingHandler`, naming where the category is declared. It never succeeds
//! with the category and no handler, and it never makes the category a no-op.
//!
//! Observed with rustc 1.95.0 (debug and release): the handler crate is **not** linked, and
//! discovery **reports** the category's missing handler. rustc loads a `--extern` crate only
//! when the source names it, and a crate it does not load is not linked; Cargo passes
//! `--extern linking_handlers` to this test all the same.

use linking_categories::ProjectRenamed;
use outbox_core::error::RegistryProblem;
use outbox_core::{Category, Error, Registry};

/// The file `#[outbox_category]` records for `ProjectRenamed`: Cargo gives rustc workspace
/// members' paths relative to the workspace root.
const CATEGORIES_FILE: &str = "tests/linking/categories/src/lib.rs";

#[test]
fn the_handler_is_found_or_reported_never_silently_dropped() {
    // The handler, if linked, takes the sender: give it, so only a missing handler can fail.
    let (sender, _receiver) = std::sync::mpsc::channel::<ProjectRenamed>();
    match Registry::builder().discovered().state(sender).build() {
        Ok(registry) => {
            // Found: the handler crate was linked, so its handler must be there.
            let info = registry
                .category(ProjectRenamed::ID)
                .expect("a registry built without error knows every declared category");
            assert_eq!(info.identity.name, ProjectRenamed::NAME);
            assert!(
                !info.no_op,
                "the category was given a no-op instead of its handler: {info:?}"
            );
        }
        Err(error) => {
            // Reported: exactly one problem, the category's missing handler, at its declaration.
            let text = error.to_string();
            let Error::Registry { problems } = &error else {
                panic!("expected a registry error, got {error:?}");
            };
            let [
                RegistryProblem::MissingHandler {
                    category,
                    type_name,
                },
            ] = problems.as_slice()
            else {
                panic!("expected exactly one MissingHandler problem, got {problems:?}");
            };
            assert_eq!(
                (category.name, category.id),
                (ProjectRenamed::NAME, i64::from(ProjectRenamed::ID.0))
            );
            let at = category.at.expect("a declared category has a location");
            assert_eq!(at.file, CATEGORIES_FILE, "{at}");
            let expected = format!(
                "category `{}` (id {}, at {CATEGORIES_FILE}:",
                ProjectRenamed::NAME,
                ProjectRenamed::ID.0
            );
            assert_eq!(*type_name, "ProjectRenamed");
            assert!(
                text.contains(&expected)
                    && text.contains("has no handler")
                    && text.contains("`Delivery<ProjectRenamed>`")
                    && text.contains("`use the_handlers_crate as _;`"),
                "{text}"
            );
        }
    }
}
