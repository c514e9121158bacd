//! `cargo xtask release-check`: the crates published, in dependency order, to a registry on
//! this machine (`cargo-http-registry`), then used from there by a new crate outside the
//! workspace as a user would (`cargo add outbox --features postgres,sqlite`): the README's first
//! outbox built and run on SQLite, and every other feature built from its package alone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The registry's name in cargo's configuration (given through the environment).
const REGISTRY: &str = "rehearsal";

/// The registry server.
const SERVER: &str = "cargo-http-registry";

/// How to get [`SERVER`], said when it is missing.
pub(crate) const INSTALL_SERVER: &str = "cargo-http-registry: install it with `cargo install \
                                         cargo-http-registry --locked` (.ci/run installs it)";

/// Whether [`SERVER`] can be run (its `--version` prints the version, and exits with 1).
pub(crate) fn server_installed() -> bool {
    Command::new(SERVER)
        .arg("--version")
        .output()
        .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).starts_with(SERVER))
}

/// What the README's first outbox prints when it ran.
const RAN: &str = "organization 42 is now Acme";

/// The features the README's `cargo add` names, then every other one, built from the
/// packages.
const FIRST: &str = "postgres,sqlite";
const EVERY: &str = "postgres,sqlite,mysql,nats,kafka,rabbitmq,redis,cli,web,testkit,uuid,\
                     opentelemetry";

/// The rehearsal, in a temporary directory kept (and named) if it fails. `published` are
/// the workspace's packages to publish; `target` the target directory to build the new crate
/// in (the workspace's, so that what it already built is reused).
pub(crate) fn rehearse(cargo: &str, published: &[String], target: &Path) -> Result<(), String> {
    let dir = tempfile::Builder::new()
        .prefix("outbox-release-check-")
        .tempdir()
        .map_err(|error| format!("cannot create a temporary directory: {error}"))?;
    let cached = Cached::before();
    let result =
        Rehearsal::start(cargo, dir.path(), target).and_then(|rehearsal| rehearsal.run(published));
    cached.remove_new();
    if result.is_err() {
        let kept = dir.keep();
        eprintln!("==> the rehearsal's files are kept in {}", kept.display());
    }
    result
}

/// What cargo keeps of each registry it reads (`$CARGO_HOME/registry/{index,cache,src}/…`):
/// the rehearsal's registry is a new one each time (its index is in a new temporary
/// directory, so that no crate of an earlier rehearsal is taken for this one's), and what
/// cargo kept of it is removed after.
struct Cached {
    kinds: Vec<(PathBuf, Vec<std::ffi::OsString>)>,
}

impl Cached {
    fn before() -> Self {
        let home = std::env::var_os("CARGO_HOME").map_or_else(
            || {
                std::env::var_os("HOME")
                    .map_or_else(PathBuf::new, PathBuf::from)
                    .join(".cargo")
            },
            PathBuf::from,
        );
        let kinds = ["index", "cache", "src"]
            .into_iter()
            .map(|kind| {
                let dir = home.join("registry").join(kind);
                let names = entries(&dir);
                (dir, names)
            })
            .collect();
        Self { kinds }
    }

    fn remove_new(&self) {
        for (dir, before) in &self.kinds {
            for name in entries(dir) {
                if !before.contains(&name) {
                    let _ = std::fs::remove_dir_all(dir.join(&name));
                }
            }
        }
    }
}

/// The names in `dir`, none if it cannot be read.
fn entries(dir: &Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir).map_or_else(
        |_| Vec::new(),
        |entries| entries.flatten().map(|entry| entry.file_name()).collect(),
    )
}

/// A registry server running over a directory, and the cargo that publishes to it.
struct Rehearsal<'a> {
    cargo: &'a str,
    dir: &'a Path,
    target: &'a Path,
    server: Child,
}

impl Drop for Rehearsal<'_> {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

impl<'a> Rehearsal<'a> {
    fn start(cargo: &'a str, dir: &'a Path, target: &'a Path) -> Result<Self, String> {
        let registry = dir.join("registry");
        let server = Command::new(SERVER)
            .arg("--addr")
            .arg("127.0.0.1:0")
            .arg(&registry)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("registry.log")).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|error| format!("cannot run {SERVER} ({error}); {INSTALL_SERVER}"))?;
        let rehearsal = Self {
            cargo,
            dir,
            target,
            server,
        };
        // The server writes the index's configuration once it listens.
        let started = Instant::now();
        while !registry.join("config.json").exists() {
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!("{SERVER} did not start within 30 s"));
            }
            #[expect(
                clippy::disallowed_methods,
                reason = "the release check runs on no runtime: this thread has nothing else to do"
            )]
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(rehearsal)
    }

    /// `cargo ARGS` in `dir`, publishing to and reading from the rehearsal's registry;
    /// returns what it printed, or fails saying what `what` was.
    fn cargo(&self, what: &str, dir: &Path, args: &[&str]) -> Result<String, String> {
        eprintln!("==> release check, {what}: cargo {}", args.join(" "));
        let index = format!("file://{}", self.dir.join("registry").display());
        let output = Command::new(self.cargo)
            .args(args)
            .current_dir(dir)
            .env("CARGO_REGISTRIES_REHEARSAL_INDEX", index)
            .env("CARGO_REGISTRIES_REHEARSAL_TOKEN", "rehearsal")
            .env("CARGO_TARGET_DIR", self.target)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|error| format!("cannot run {}: {error}", self.cargo))?;
        if !output.status.success() {
            return Err(format!("{what} failed ({})", output.status));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn run(&self, published: &[String]) -> Result<(), String> {
        let workspace = workspace_root()?;
        let source = self.dir.join("source");
        copy_for_the_registry(&workspace, &source)?;
        let mut publish = vec![
            "publish",
            "--registry",
            REGISTRY,
            "--no-verify",
            "--allow-dirty",
        ];
        for name in published {
            publish.extend(["--package", name.as_str()]);
        }
        self.cargo("publishing every crate", &source, &publish)?;

        let app = self.dir.join("app");
        self.cargo(
            "a new crate",
            self.dir,
            &[
                "new",
                "--vcs",
                "none",
                "--bin",
                "--name",
                "first-outbox",
                "app",
            ],
        )?;
        // The versions the workspace was tested with, where the new crate has the same
        // dependencies.
        std::fs::copy(workspace.join("Cargo.lock"), app.join("Cargo.lock"))
            .map_err(|error| format!("cannot copy Cargo.lock: {error}"))?;
        self.cargo(
            "adding outbox from the registry",
            &app,
            &["add", "outbox", "--registry", REGISTRY, "--features", FIRST],
        )?;
        self.cargo(
            "adding serde",
            &app,
            &["add", "serde", "--features", "derive"],
        )?;
        self.cargo(
            "adding tokio",
            &app,
            &["add", "tokio", "--features", "macros,rt"],
        )?;
        let readme = std::fs::read_to_string(workspace.join("README.md"))
            .map_err(|error| format!("cannot read the README: {error}"))?;
        let first = first_rust_block(&readme).ok_or("the README has no ```rust block")?;
        std::fs::write(app.join("src/main.rs"), first)
            .map_err(|error| format!("cannot write the new crate's main.rs: {error}"))?;
        let printed = self.cargo(
            "running the README's first outbox",
            &app,
            &["run", "--quiet"],
        )?;
        if !printed.contains(RAN) {
            return Err(format!(
                "the README's first outbox ran without delivering (it printed {printed:?})"
            ));
        }
        self.cargo(
            "every feature",
            &app,
            &["add", "outbox", "--registry", REGISTRY, "--features", EVERY],
        )?;
        self.cargo("building every feature", &app, &["build", "--quiet"])?;
        Ok(())
    }
}

/// The workspace's files (those git tracks or would, not those it ignores) copied to `to`,
/// with each of the workspace's own crates depended on from the rehearsal's registry: a path
/// dependency is published as one on crates.io unless it names another registry. Nothing
/// else differs from what `cargo publish` sends crates.io.
fn copy_for_the_registry(workspace: &Path, to: &Path) -> Result<(), String> {
    let listed = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(workspace)
        .output()
        .map_err(|error| format!("cannot run git: {error}"))?;
    if !listed.status.success() {
        return Err("git cannot list the workspace's files".to_owned());
    }
    for file in listed
        .stdout
        .split(|byte| *byte == 0)
        .filter(|name| !name.is_empty())
    {
        let file = Path::new(std::str::from_utf8(file).map_err(|error| error.to_string())?);
        let from = workspace.join(file);
        if !from.is_file() {
            continue; // listed, but deleted in the work tree
        }
        let copy = to.join(file);
        if let Some(parent) = copy.parent() {
            std::fs::create_dir_all(parent).map_err(|error| error.to_string())?;
        }
        std::fs::copy(&from, &copy)
            .map_err(|error| format!("cannot copy {}: {error}", file.display()))?;
    }
    let manifest = to.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).map_err(|error| error.to_string())?;
    let rewritten: Vec<String> = text
        .lines()
        .map(|line| {
            if line.starts_with("outbox") && line.contains("{ path = ") {
                line.replacen(
                    "{ path = ",
                    &format!("{{ registry = \"{REGISTRY}\", path = "),
                    1,
                )
            } else {
                line.to_owned()
            }
        })
        .collect();
    std::fs::write(&manifest, rewritten.join("\n") + "\n").map_err(|error| error.to_string())
}

/// The first ```rust block of `markdown`, without its fences.
fn first_rust_block(markdown: &str) -> Option<String> {
    let mut lines = markdown.lines().skip_while(|line| line.trim() != "```rust");
    lines.next()?;
    let block: Vec<&str> = lines.take_while(|line| line.trim() != "```").collect();
    Some(block.join("\n") + "\n")
}

/// The workspace's root: the parent of this crate's directory.
fn workspace_root() -> Result<PathBuf, String> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| "xtask has no parent directory".to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_first_rust_block_is_read_without_its_fences() {
        let markdown = "# Title\n\n```sh\ncargo add outbox\n```\n\n```rust\nfn main() {}\n```\n\n```rust\nfn other() {}\n```\n";
        assert_eq!(
            super::first_rust_block(markdown).as_deref(),
            Some("fn main() {}\n")
        );
        assert_eq!(super::first_rust_block("no code"), None);
    }
}
