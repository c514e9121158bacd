//! Compile-time guarantees of `#[outbox_testkit::test]`: each mistake is a clear error at the
//! user's token. The expected messages are the reviewed `.stderr` files beside each case,
//! re-blessed with `TRYBUILD=overwrite cargo test -p outbox-testkit --test compiletest`.

#![cfg(all(feature = "postgres", feature = "sqlite"))]

#[test]
fn test_attribute_mistakes_are_compile_errors() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
