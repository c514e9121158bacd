use outbox_core::outbox_scope;

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_scope(id = 1)]
struct User;

fn main() {}
