//! The application of the linking test. It depends on `linking-categories` and
//! `linking-handlers` in Cargo.toml; this library names neither, so each integration test
//! decides for itself whether the handler crate is named in source:
//!
//! - `tests/only_in_cargo_toml.rs` never names `linking_handlers`: `Registry::discover()` must
//!   either find its handler or refuse the category with `RegistryProblem::MissingHandler`
//!   pointing at the category's declaration — never succeed without the handler.
//! - `tests/named_in_source.rs` names it (`use linking_handlers as _;`): the handler is found,
//!   and a relay delivers a message to it.
