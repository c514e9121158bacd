//! The crates' module structure: no two top-level modules of a crate import each other,
//! directly or through others, and `outbox-core`'s modules keep the layering its `lib.rs`
//! states (each uses only the modules listed before it).
//!
//! A module's imports are read from its source: every `crate::name` (and `$crate::name`) in
//! its files, comments left out. Submodules count as their top-level module: a module's own
//! parts may use each other.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules of the crate whose sources are in `src`, each with the top-level
/// modules it names.
fn modules(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.to_path_buf()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            for entry in fs::read_dir(&path).expect("a source directory") {
                files.push(entry.expect("a directory entry").path());
            }
            continue;
        }
        if path.extension().is_none_or(|extension| extension != "rs") {
            continue;
        }
        let relative = path.strip_prefix(src).expect("under src");
        let first = relative.components().next().expect("a file");
        let top = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" || top == "main" {
            continue;
        }
        // `#[path = "private.rs"] pub mod __private`.
        let top = if top == "private" {
            "__private".to_owned()
        } else {
            top
        };
        let source = fs::read_to_string(&path).expect("a source file");
        let named = modules.entry(top.clone()).or_default();
        for line in source.lines() {
            let code = line.split("//").next().unwrap_or_default();
            for (index, _) in code.match_indices("crate::") {
                let name: String = code[index + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != top {
                    named.insert(name);
                }
            }
        }
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    for named in modules.values_mut() {
        named.retain(|name| names.contains(name));
    }
    modules
}

/// A cycle among `modules`, if there is one: its modules in import order, the first again at
/// the end.
fn cycle(modules: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        module: &str,
        modules: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(module.to_owned(), Mark::Open);
        path.push(module.to_owned());
        for named in &modules[module] {
            match marks[named] {
                Mark::Open => {
                    let start = path.iter().position(|m| m == named).expect("on the path");
                    let mut cycle = path[start..].to_vec();
                    cycle.push(named.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(cycle) = visit(named, modules, marks, path) {
                        return Some(cycle);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(module.to_owned(), Mark::Done);
        None
    }
    let mut marks: BTreeMap<String, Mark> = modules
        .keys()
        .map(|name| (name.clone(), Mark::New))
        .collect();
    for module in modules.keys() {
        if marks[module] == Mark::New
            && let Some(cycle) = visit(module, modules, &mut marks, &mut Vec::new())
        {
            return Some(cycle);
        }
    }
    None
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

#[test]
fn no_two_modules_of_a_crate_import_each_other() {
    let mut crates = 0;
    for entry in fs::read_dir(workspace()).expect("the workspace") {
        let dir = entry.expect("an entry").path();
        let is_crate = dir
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("outbox-"));
        if !is_crate || !dir.join("src").is_dir() {
            continue;
        }
        crates += 1;
        if let Some(cycle) = cycle(&modules(&dir.join("src"))) {
            panic!(
                "{}: its modules import each other: {}",
                dir.display(),
                cycle.join(" -> ")
            );
        }
    }
    assert!(crates >= 10, "found only {crates} crates");
}

#[test]
fn outbox_core_keeps_its_layers() {
    let src = workspace().join("outbox-core/src");
    let lib = fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    // The `// Layers:` comment, up to the first line that is not a comment.
    let layers: Vec<String> = lib
        .lines()
        .skip_while(|line| !line.starts_with("// Layers:"))
        .take_while(|line| line.starts_with("//"))
        .flat_map(|line| line.split('`').skip(1).step_by(2).map(str::to_owned))
        .filter(|name| !name.contains('/'))
        .collect();
    assert!(layers.len() > 20, "lib.rs lists its layers: {layers:?}");
    let place = |name: &str| layers.iter().position(|listed| listed == name);
    for (module, named) in modules(&src) {
        let Some(at) = place(&module) else {
            panic!("outbox-core's `{module}` is in no layer: list it in lib.rs's `// Layers:`");
        };
        for other in named {
            let above = place(&other).is_none_or(|theirs| theirs > at);
            assert!(
                !above,
                "outbox-core's `{module}` uses `{other}`, which lib.rs's layers list after it"
            );
        }
    }
}
