//! `leasehold-api-listing [--bless] [CRATE...]`: the public API of each published leasehold
//! library as a sorted text file, `api/<crate>.txt`, one line per public item, so that a change
//! to what users can name shows as a diff in review. Without `--bless` it regenerates the
//! listings and fails with a unified diff where one differs from the committed file; with
//! `--bless` it writes them. `./scripts/public-api` runs it, and `./scripts/test` runs the check.
//!
//! The listing is read from rustdoc's JSON output, which is unstable: stable rustdoc writes it
//! only with `RUSTC_BOOTSTRAP=1`. That variable is given to rustdoc alone, by passing this
//! program to cargo as `RUSTDOC`: a build script (proc-macro2's) reruns when the variable
//! changes, so setting it for the whole cargo run would rebuild nearly every dependency here and
//! again at the next ordinary build.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use public_api::tokens::Token;
use serde::Deserialize;

/// The published libraries whose surface users build on. The CLI, the bench, the workload, the
/// conformance suite and the test servers are left out: they are programs or test support,
/// whose Rust API no user is promised.
const CRATES: [&str; 14] = [
    "leasehold",
    "leasehold-core",
    "leasehold-memory",
    "leasehold-sqlite",
    "leasehold-postgres",
    "leasehold-mysql",
    "leasehold-sql-common",
    "leasehold-etcd",
    "leasehold-zookeeper",
    "leasehold-redis",
    "leasehold-gate-sql",
    "leasehold-gate-http",
    "leasehold-gate-object",
    "leasehold-object-store",
];

/// Set by this program for the copy of itself that cargo runs as `RUSTDOC`: the rustdoc to run.
const WRAPPED_RUSTDOC: &str = "LEASEHOLD_API_LISTING_RUSTDOC";

/// Traits whose impls are left out of the listings. The auto traits users build on stay (`Send`
/// and `Sync` for spawning and sharing, `Unpin` for polling in place); these follow from private
/// fields and the standard library's internals, so a dependency or toolchain update would move
/// them without any change of ours, and `StructuralPartialEq` repeats what the `PartialEq` line
/// says.
const LEFT_OUT_TRAITS: [&str; 5] = [
    "core::marker::Freeze",
    "core::marker::UnsafeUnpin",
    "core::marker::StructuralPartialEq",
    "core::panic::unwind_safe::RefUnwindSafe",
    "core::panic::unwind_safe::UnwindSafe",
];

/// Where the listings live, under the workspace root.
const LISTING_DIR: &str = "api";

const USAGE: &str = "usage: leasehold-api-listing [--bless] [CRATE...]

Writes the public API of each published leasehold library, one sorted line per item, and
compares it with api/<crate>.txt: exits 1 with a diff where they differ. --bless writes the
files instead. With no CRATE, every listed library:";

fn main() -> ExitCode {
    if let Some(rustdoc) = std::env::var_os(WRAPPED_RUSTDOC) {
        return run_rustdoc(rustdoc);
    }
    match run() {
        Ok(Outcome::Same) => ExitCode::SUCCESS,
        Ok(Outcome::Differs) => ExitCode::from(1),
        Err(message) => {
            eprintln!("leasehold-api-listing: {message}");
            ExitCode::from(2)
        }
    }
}

enum Outcome {
    Same,
    Differs,
}

/// The rustdoc step, run by cargo in place of rustdoc: the real one, allowed its JSON output.
fn run_rustdoc(rustdoc: OsString) -> ExitCode {
    use std::os::unix::process::CommandExt as _;
    let error = Command::new(&rustdoc)
        .args(std::env::args_os().skip(1))
        .env("RUSTC_BOOTSTRAP", "1")
        .exec();
    eprintln!(
        "leasehold-api-listing: cannot run {}: {error}",
        rustdoc.to_string_lossy()
    );
    ExitCode::from(101)
}

fn run() -> Result<Outcome, String> {
    let mut bless = false;
    let mut chosen = Vec::new();
    for arg in std::env::args_os().skip(1) {
        let arg = arg.to_string_lossy();
        match arg.as_ref() {
            "--bless" => bless = true,
            "-h" | "--help" => {
                println!("{USAGE} {}.", CRATES.join(", "));
                return Ok(Outcome::Same);
            }
            flag if flag.starts_with('-') => {
                return Err(format!(
                    "unknown option {flag}\n\n{USAGE} {}.",
                    CRATES.join(", ")
                ))
            }
            name if CRATES.contains(&name) => chosen.push(name.to_string()),
            name => {
                return Err(format!(
                    "{name} is not one of the listed libraries: {}",
                    CRATES.join(", ")
                ))
            }
        }
    }
    let all = chosen.is_empty();
    if all {
        chosen = CRATES.iter().map(|c| c.to_string()).collect();
    }

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = Workspace::read(&cargo)?;
    // Every library is documented, chosen or not: the listing of one names the types of the
    // others by their public paths, which only their own documentation knows.
    let mut documented = Vec::new();
    let mut public_paths = BTreeMap::new();
    for name in CRATES {
        eprintln!("documenting {name}");
        let json = workspace.rustdoc_json(&cargo, name)?;
        public_paths.extend(public_paths_of(&read_crate(&json)?));
        documented.push((name, json));
    }
    let dir = workspace.root.join(LISTING_DIR);
    let mut differing = Vec::new();
    for (name, json) in documented {
        if !chosen.iter().any(|c| c == name) {
            continue;
        }
        let listing = listing(&json, &public_paths)?;
        let path = dir.join(format!("{name}.txt"));
        let shown = format!("{LISTING_DIR}/{name}.txt");
        let committed = match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("cannot read {shown}: {e}")),
        };
        if committed.as_deref() == Some(listing.as_str()) {
            continue;
        }
        if bless {
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {LISTING_DIR}/: {e}"))?;
            std::fs::write(&path, &listing).map_err(|e| format!("cannot write {shown}: {e}"))?;
            eprintln!("wrote {shown}");
        } else {
            let old = committed.unwrap_or_default();
            let diff = similar::TextDiff::from_lines(&old, &listing);
            print!(
                "{}",
                diff.unified_diff()
                    .context_radius(3)
                    .header(&format!("{shown} (committed)"), &format!("{shown} (now)"))
            );
            differing.push(shown);
        }
    }
    // A listing of a renamed or dropped crate would otherwise stay in api/, unchecked.
    if all {
        for stray in strays(&dir)? {
            let shown = format!("{LISTING_DIR}/{stray}");
            if bless {
                std::fs::remove_file(dir.join(&stray))
                    .map_err(|e| format!("cannot remove {shown}: {e}"))?;
                eprintln!(
                    "removed {shown}, which lists no library of {}",
                    CRATES.join(", ")
                );
            } else {
                eprintln!("{shown} lists no library of {}", CRATES.join(", "));
                differing.push(shown);
            }
        }
    }
    if differing.is_empty() {
        return Ok(Outcome::Same);
    }
    eprintln!(
        "\nthe public API differs from the committed listing in {}.\n\
         If the change is intended, run ./scripts/public-api --bless and commit {LISTING_DIR}/.",
        differing.join(", ")
    );
    Ok(Outcome::Differs)
}

/// The files in `dir` that are no listing of [`CRATES`], such as one of a renamed crate.
fn strays(dir: &Path) -> Result<Vec<String>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {LISTING_DIR}/: {e}")),
    };
    let mut strays = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {LISTING_DIR}/: {e}"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let listed = name
            .strip_suffix(".txt")
            .is_some_and(|stem| CRATES.contains(&stem));
        if !listed {
            strays.push(name);
        }
    }
    strays.sort();
    Ok(strays)
}

/// What `cargo metadata` says of the workspace that this program lists.
struct Workspace {
    root: PathBuf,
    target: PathBuf,
    /// Package name to the name of its library target (`leasehold-core` to `leasehold_core`).
    libraries: Vec<(String, String)>,
}

#[derive(Deserialize)]
struct Metadata {
    workspace_root: PathBuf,
    target_directory: PathBuf,
    packages: Vec<Package>,
}

#[derive(Deserialize)]
struct Package {
    name: String,
    targets: Vec<Target>,
}

#[derive(Deserialize)]
struct Target {
    name: String,
    kind: Vec<String>,
}

impl Workspace {
    fn read(cargo: &OsString) -> Result<Self, String> {
        let output = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .output()
            .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "cargo metadata failed ({}):\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let metadata: Metadata = serde_json::from_slice(&output.stdout)
            .map_err(|e| format!("cannot read cargo metadata's output: {e}"))?;
        let libraries = metadata
            .packages
            .into_iter()
            .filter_map(|package| {
                let lib = package
                    .targets
                    .into_iter()
                    .find(|t| t.kind.iter().any(|k| k == "lib"))?;
                Some((package.name, lib.name))
            })
            .collect();
        Ok(Self {
            root: metadata.workspace_root,
            target: metadata.target_directory,
            libraries,
        })
    }

    /// Runs rustdoc on the library of `package` with every feature, and returns where its JSON
    /// was written.
    fn rustdoc_json(&self, cargo: &OsString, package: &str) -> Result<PathBuf, String> {
        let lib = self
            .libraries
            .iter()
            .find(|(name, _)| name == package)
            .map(|(_, lib)| lib)
            .ok_or_else(|| format!("{package} is no library of this workspace"))?;
        let me = std::env::current_exe()
            .map_err(|e| format!("cannot find this program's own path: {e}"))?;
        let rustdoc = std::env::var_os("RUSTDOC").unwrap_or_else(|| "rustdoc".into());
        let output = Command::new(cargo)
            .args([
                "rustdoc",
                "--quiet",
                "--locked",
                "--lib",
                "--all-features",
                "-p",
            ])
            .arg(package)
            .args(["--", "-Z", "unstable-options", "--output-format", "json"])
            .current_dir(&self.root)
            .env("RUSTDOC", me)
            .env(WRAPPED_RUSTDOC, rustdoc)
            .output()
            .map_err(|e| format!("cannot run cargo rustdoc: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "cargo rustdoc -p {package} failed ({}):\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(self.target.join("doc").join(format!("{lib}.json")))
    }
}

/// Reads rustdoc's JSON at `json`, refusing a format this program was not built for.
fn read_crate(json: &Path) -> Result<rustdoc_types::Crate, String> {
    let shown = json.display();
    let text = std::fs::read_to_string(json).map_err(|e| format!("cannot read {shown}: {e}"))?;
    #[derive(Deserialize)]
    struct Format {
        format_version: u32,
    }
    // The version first: another format may not parse, or worse, parse into the wrong fields.
    let format: Format =
        serde_json::from_str(&text).map_err(|e| format!("{shown} is no rustdoc JSON: {e}"))?;
    if format.format_version != rustdoc_types::FORMAT_VERSION {
        return Err(format!(
            "rustdoc wrote format {} in {shown}, and this program reads format {}: \
             pin the public-api release built on rustdoc-types {}.x in \
             crates/api-listing/Cargo.toml, then run ./scripts/public-api --bless",
            format.format_version,
            rustdoc_types::FORMAT_VERSION,
            format.format_version,
        ));
    }
    serde_json::from_str(&text).map_err(|e| format!("cannot read {shown}: {e}"))
}

/// The public path of each item of `krate` that is known elsewhere by the path of its
/// definition: `leasehold_core::grant::Grant` to `leasehold_core::Grant`. rustdoc names the items
/// of other crates by their definition, inside modules that may be private, so that moving a
/// type between private modules of core would change every backend's listing.
fn public_paths_of(krate: &rustdoc_types::Crate) -> BTreeMap<String, String> {
    use rustdoc_types::{ItemEnum, Use};
    let Some(name) = krate
        .index
        .get(&krate.root)
        .and_then(|root| root.name.clone())
    else {
        return BTreeMap::new();
    };
    // Breadth first, so the first path found for an item is one of the shortest.
    let mut public: BTreeMap<rustdoc_types::Id, String> = BTreeMap::new();
    let mut modules = std::collections::VecDeque::from([(krate.root, name)]);
    let mut visited = BTreeSet::new();
    while let Some((id, path)) = modules.pop_front() {
        if !visited.insert(id) {
            continue;
        }
        let Some(ItemEnum::Module(module)) = krate.index.get(&id).map(|item| &item.inner) else {
            continue;
        };
        let mut children: Vec<(rustdoc_types::Id, String)> = Vec::new();
        for child in &module.items {
            let Some(item) = krate.index.get(child) else {
                continue;
            };
            match &item.inner {
                ItemEnum::Use(Use {
                    id: Some(target),
                    is_glob: true,
                    ..
                }) => modules.push_back((*target, path.clone())),
                ItemEnum::Use(Use {
                    id: Some(target),
                    name,
                    ..
                }) => children.push((*target, format!("{path}::{name}"))),
                _ => {
                    if let Some(name) = &item.name {
                        children.push((*child, format!("{path}::{name}")));
                    }
                }
            }
        }
        // Sorted, so that of two paths of one length the same one wins every run.
        children.sort();
        for (target, child_path) in children {
            if matches!(
                krate.index.get(&target).map(|i| &i.inner),
                Some(ItemEnum::Module(_))
            ) {
                modules.push_back((target, child_path.clone()));
            }
            public.entry(target).or_insert(child_path);
        }
    }
    public
        .into_iter()
        .filter_map(|(id, public)| {
            let summary = krate.paths.get(&id)?;
            let defined = summary.path.join("::");
            (summary.crate_id == 0 && defined != public).then_some((defined, public))
        })
        .collect()
}

/// The listing of one crate: the items public-api finds in rustdoc's JSON at `json`, one line
/// each, in its order (by item path, members right after their type), ending in a newline. The
/// paths of other listed crates' items are written as `public_paths` says.
fn listing(json: &Path, public_paths: &BTreeMap<String, String>) -> Result<String, String> {
    let api = public_api::Builder::from_rustdoc_json(json)
        .omit_blanket_impls(true)
        .build()
        .map_err(|e| format!("cannot list the items in {}: {e}", json.display()))?;
    let mut seen = BTreeSet::new();
    let mut out = String::new();
    for item in api.items() {
        let tokens: Vec<&Token> = item.tokens().collect();
        let line = render(&tokens, public_paths);
        if is_left_out(&line) {
            continue;
        }
        if seen.insert(line.clone()) {
            let _ = writeln!(out, "{line}");
        }
    }
    Ok(out)
}

/// The text of `tokens`, each path (`a::b::Type`) written as `public_paths` says.
fn render(tokens: &[&Token], public_paths: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < tokens.len() {
        if let Some((end, path)) = path_at(tokens, i) {
            out.push_str(public_paths.get(&path).unwrap_or(&path));
            i = end;
        } else {
            out.push_str(tokens[i].text());
            i += 1;
        }
    }
    out
}

/// The path starting at `tokens[start]`, as public-api renders a type's path (identifiers and
/// `::`, ending in the type), with the index after it.
fn path_at(tokens: &[&Token], start: usize) -> Option<(usize, String)> {
    let mut path = String::new();
    let mut i = start;
    while let (Some(Token::Identifier(part)), Some(Token::Symbol(colons))) =
        (tokens.get(i), tokens.get(i + 1))
    {
        if colons != "::" {
            return None;
        }
        path.push_str(part);
        path.push_str("::");
        i += 2;
    }
    match tokens.get(i) {
        Some(Token::Type(name)) if i > start => {
            path.push_str(name);
            Some((i + 1, path))
        }
        _ => None,
    }
}

/// Whether `line` is an impl of one of [`LEFT_OUT_TRAITS`], negative ones (`impl !Trait for`)
/// included.
fn is_left_out(line: &str) -> bool {
    line.starts_with("impl")
        && LEFT_OUT_TRAITS
            .iter()
            .any(|t| line.contains(&format!("{t} for ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(text: &str) -> Token {
        Token::Identifier(text.into())
    }
    fn colons() -> Token {
        Token::Symbol("::".into())
    }
    fn ty(text: &str) -> Token {
        Token::Type(text.into())
    }
    fn keyword(text: &str) -> Token {
        Token::Keyword(text.into())
    }

    fn expect(what: &str, got: &str, want: &str) -> Result<(), String> {
        if got == want {
            Ok(())
        } else {
            Err(format!("{what}: got {got:?}, want {want:?}"))
        }
    }

    #[test]
    fn paths_of_other_crates_are_written_by_their_public_name() -> Result<(), String> {
        let tokens = [
            keyword("impl"),
            Token::Whitespace,
            ident("leasehold_core"),
            colons(),
            ident("authority"),
            colons(),
            ty("Authority"),
            Token::Whitespace,
            keyword("for"),
            Token::Whitespace,
            ident("leasehold_memory"),
            colons(),
            ty("MemoryAuthority"),
        ];
        let tokens: Vec<&Token> = tokens.iter().collect();
        let public = BTreeMap::from([(
            "leasehold_core::authority::Authority".to_string(),
            "leasehold_core::Authority".to_string(),
        )]);
        expect(
            "an impl of a re-exported trait",
            &render(&tokens, &public),
            "impl leasehold_core::Authority for leasehold_memory::MemoryAuthority",
        )?;
        expect(
            "the same impl with no public paths known",
            &render(&tokens, &BTreeMap::new()),
            "impl leasehold_core::authority::Authority for leasehold_memory::MemoryAuthority",
        )
    }

    #[test]
    fn only_whole_paths_are_replaced() -> Result<(), String> {
        // `a::b` is known, but here it is the start of a longer path, and `b` alone is no path.
        let public = BTreeMap::from([("a::b".to_string(), "a::c".to_string())]);
        let longer = [ident("a"), colons(), ident("b"), colons(), ty("D")];
        let longer: Vec<&Token> = longer.iter().collect();
        expect("a longer path", &render(&longer, &public), "a::b::D")?;
        let bare = [ty("b")];
        let bare: Vec<&Token> = bare.iter().collect();
        expect("a bare type", &render(&bare, &public), "b")?;
        let known = [ident("a"), colons(), ty("b")];
        let known: Vec<&Token> = known.iter().collect();
        expect("the known path", &render(&known, &public), "a::c")
    }

    #[test]
    fn noisy_trait_impls_are_left_out_and_the_rest_kept() -> Result<(), String> {
        let left_out = [
            "impl core::marker::Freeze for leasehold_core::Lease",
            "impl !core::panic::unwind_safe::RefUnwindSafe for leasehold_core::Lease",
            "impl<T> core::panic::unwind_safe::UnwindSafe for leasehold_postgres::guarded::Claimed<T> where T: core::panic::unwind_safe::UnwindSafe",
            "impl core::marker::StructuralPartialEq for leasehold_core::Fence",
        ];
        let kept = [
            "impl core::marker::Send for leasehold_core::Lease",
            "impl !core::marker::Sync for leasehold_core::Lease",
            "impl core::cmp::PartialEq for leasehold_core::Fence",
            "pub fn leasehold_core::Lease::fence(&self) -> leasehold_core::Fence",
        ];
        let wrong: Vec<&str> = left_out
            .iter()
            .filter(|line| !is_left_out(line))
            .chain(kept.iter().filter(|line| is_left_out(line)))
            .copied()
            .collect();
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!("misjudged: {wrong:?}"))
        }
    }
}
