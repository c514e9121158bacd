//! The guides' code (`docs/*.md`), compiled. Each guide's ```rust blocks are fragments (a
//! handler, a transaction, a `main`), written for reading; each module here holds one guide's
//! blocks, line by line and in order, with what they need around them (imports, the
//! functions they call, a body for their statements). `tests/blocks.rs` fails if a block's
//! lines are not found in order in one of these modules, so a guide's code cannot drift
//! from code that compiles. The modules are not formatted, so that their lines stay the
//! guides' own.

// What the guides call (a control silo, an audit log, a charge) does nothing here.
#![allow(missing_docs, dead_code, clippy::unused_async)]

// `docs/operating.md` embeds the command in a service's crate, named `my_service` there.
extern crate self as my_service;

#[rustfmt::skip]
pub mod console;
#[rustfmt::skip]
pub mod inbox;
#[rustfmt::skip]
pub mod observability;
#[rustfmt::skip]
pub mod operating;
#[rustfmt::skip]
pub mod writing;
