//! Every ```rust block of the guides (`docs/*.md`) is compiled: its lines are found, in order,
//! in one of this crate's modules (other lines may come between them: imports, the functions
//! a fragment calls, the body its statements need). Lines are compared with their spaces
//! collapsed; blank lines are skipped.

use std::path::{Path, PathBuf};

/// `line` with its runs of whitespace collapsed to one space, trimmed.
fn normalized(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The ```rust blocks of `markdown`: the line each starts on, and its non-blank lines.
fn rust_blocks(markdown: &str) -> Vec<(usize, Vec<String>)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, Vec<String>)> = None;
    for (number, line) in markdown.lines().enumerate() {
        match &mut open {
            None if line.trim_start().starts_with("```rust") => {
                open = Some((number + 1, Vec::new()));
            }
            None => {}
            Some(_) if line.trim_start().starts_with("```") => blocks.extend(open.take()),
            Some((_, lines)) if !line.trim().is_empty() => lines.push(normalized(line)),
            Some(_) => {}
        }
    }
    blocks
}

/// How many of `block`'s lines are found in order in `source` (all of them: it is there).
fn found_in_order(source: &[String], block: &[String]) -> usize {
    let mut source = source.iter();
    block
        .iter()
        .take_while(|line| source.any(|candidate| candidate == *line))
        .count()
}

fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|found| found == extension))
        .collect();
    files.sort();
    files
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()))
}

#[test]
fn every_block_of_the_guides_is_compiled_here() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let modules: Vec<(PathBuf, Vec<String>)> = files(&crate_dir.join("src"), "rs")
        .into_iter()
        .map(|path| {
            let lines = read(&path).lines().map(normalized).collect();
            (path, lines)
        })
        .collect();
    let mut checked = 0;
    let mut missing = Vec::new();
    for guide in files(&crate_dir.join("../../docs"), "md") {
        for (start, block) in rust_blocks(&read(&guide)) {
            checked += 1;
            let best = modules
                .iter()
                .map(|(_, source)| found_in_order(source, &block))
                .max()
                .unwrap_or(0);
            if best < block.len() {
                missing.push(format!(
                    "{}:{start}: line {} of the block is not in tests/guides/src after the ones \
                     before it: {}",
                    guide.file_name().unwrap_or_default().to_string_lossy(),
                    best + 1,
                    block[best]
                ));
            }
        }
    }
    assert!(checked >= 9, "only {checked} blocks found in docs/");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn a_line_changed_or_out_of_order_is_not_found() {
    let source: Vec<String> = ["fn a() {", "    let x = 1;", "    let y = 2;", "}"]
        .iter()
        .map(|line| normalized(line))
        .collect();
    let block = |lines: &[&str]| {
        lines
            .iter()
            .map(|line| normalized(line))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        found_in_order(&source, &block(&["let x = 1;", "let  y = 2;"])),
        2
    );
    assert_eq!(
        found_in_order(&source, &block(&["let y = 2;", "let x = 1;"])),
        1
    );
    assert_eq!(found_in_order(&source, &block(&["let x = 3;"])), 0);
    let markdown = "text\n```rust,ignore\nlet x = 1;\n\nlet y = 2;\n```\n```sh\nls\n```\n";
    assert_eq!(
        rust_blocks(markdown),
        vec![(2, vec!["let x = 1;".to_owned(), "let y = 2;".to_owned()])]
    );
}
