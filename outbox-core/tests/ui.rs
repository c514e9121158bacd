//! Compile-time guarantees of the declaration macros: each mistake is one clear error at the
//! user's token. The expected messages are the reviewed `.stderr` files beside each case.

#[test]
fn declaration_mistakes_are_compile_errors() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
