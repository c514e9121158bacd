//! Two crates that each compile, declaring the same scope id and the same category id: the
//! compiler cannot see it (each crate's ids are unique in the crate), so `Registry::discover()`
//! refuses the binary that links both, naming both source locations of each conflict.

use linking_categories::ProjectRenamed;
use linking_rival::TeamRenamed;
use outbox_core::error::RegistryProblem;
use outbox_core::{Category, Error, Registry};

const CATEGORIES_FILE: &str = "tests/linking/categories/src/lib.rs";
const RIVAL_FILE: &str = "tests/linking/rival/src/lib.rs";

#[test]
fn ids_taken_twice_across_crates_are_refused_with_both_places() {
    assert_eq!(ProjectRenamed::ID, TeamRenamed::ID);
    let error = Registry::discover().expect_err("the ids collide");
    let Error::Registry { problems } = &error else {
        panic!("expected a registry error, got {error:?}");
    };
    let places = |first: &outbox_core::error::Site, second: &outbox_core::error::Site| {
        let mut files = [
            first.at.expect("declared").file,
            second.at.expect("declared").file,
        ];
        files.sort_unstable();
        files
    };
    let scope = problems
        .iter()
        .find_map(|problem| match problem {
            RegistryProblem::DuplicateScopeId { first, second } => Some((first, second)),
            _ => None,
        })
        .expect("the scope id is reported");
    assert_eq!(places(scope.0, scope.1), [CATEGORIES_FILE, RIVAL_FILE]);
    let category = problems
        .iter()
        .find_map(|problem| match problem {
            RegistryProblem::DuplicateCategoryId { first, second } => Some((first, second)),
            _ => None,
        })
        .expect("the category id is reported");
    assert_eq!(
        places(category.0, category.1),
        [CATEGORIES_FILE, RIVAL_FILE]
    );
    let text = error.to_string();
    assert!(
        text.contains("two categories use id 1")
            && text.contains("`project_renamed` (id 1, at tests/linking/categories/src/lib.rs:")
            && text.contains("`team_renamed` (id 1, at tests/linking/rival/src/lib.rs:")
            && text.contains("two scopes use id 1"),
        "{text}"
    );
}
