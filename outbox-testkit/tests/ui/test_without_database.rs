#[outbox_testkit::test]
async fn needs_no_database() {}

fn main() {}
