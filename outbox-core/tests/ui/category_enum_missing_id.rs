use outbox_core::{outbox_categories, outbox_scope};

#[outbox_scope(id = 1)]
struct Organization;

#[derive(serde::Serialize, serde::Deserialize)]
struct Renamed {
    name: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct MemberAdded {
    user: i64,
}

#[outbox_categories(scope = Organization)]
enum OrgEvent {
    #[category(id = 1)]
    Renamed(Renamed),
    MemberAdded(MemberAdded),
}

fn main() {}
