//! The declared minimum Rust version is true of the whole build.
//!
//! This machine has one toolchain, so the MSRV cannot be proven by compiling with it here.
//! What can be checked, is: every workspace crate declares the workspace's `rust-version`, and
//! no dependency that a build with every feature resolves for this platform declares a newer
//! one (sqlx 0.9 is what sets it today). Only this platform's dependencies: leasehold runs on
//! Unix (the CLI and the SQLite clock need it), and crates for Windows or behind `cfg(loom)`
//! are never built here. Clippy's `incompatible_msrv` lint, run with `-D warnings` by
//! `./scripts/test`, refuses standard-library APIs newer than it in our own code.

use std::process::Command;

use leasehold_conformance::kit::{OrFail, TestResult};

/// `1.94` or `1.94.0` as (1, 94, 0).
fn version(text: &str) -> TestResult<(u64, u64, u64)> {
    let mut parts = text.split('.').map(|p| p.parse::<u64>().or_fail(text));
    Ok((
        parts.next().or_fail(text)??,
        parts.next().transpose()?.unwrap_or(0),
        parts.next().transpose()?.unwrap_or(0),
    ))
}

#[test]
fn no_dependency_needs_a_newer_rust_than_the_declared_one() -> TestResult {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let rustc = Command::new("rustc")
        .arg("-vV")
        .output()
        .or_fail("rustc -vV runs")?;
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .or_fail("rustc -vV names the host")?;
    let out = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--all-features",
            "--locked",
        ])
        .args(["--manifest-path", root])
        .output()
        .or_fail("cargo metadata runs")?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).or_fail("metadata is JSON")?;
    let members: Vec<&str> = meta["workspace_members"]
        .as_array()
        .or_fail("workspace members")?
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    // What a build for this platform compiles (cargo tree applies the target's cfgs, which
    // metadata's resolve does not prune), as `name vVERSION`.
    let tree = Command::new(&cargo)
        .args([
            "tree",
            "--workspace",
            "--all-features",
            "--locked",
            "--target",
            &host,
        ])
        .args([
            "-e",
            "normal,build,dev",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .args(["--manifest-path", root])
        .output()
        .or_fail("cargo tree runs")?;
    assert!(
        tree.status.success(),
        "{}",
        String::from_utf8_lossy(&tree.stderr)
    );
    let built: std::collections::HashSet<(String, String)> = String::from_utf8_lossy(&tree.stdout)
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?.to_string();
            let version = words.next()?.strip_prefix('v')?.to_string();
            Some((name, version))
        })
        .collect();
    let mut declared = None;
    let mut too_new = Vec::new();
    let mut checked = 0;
    for package in meta["packages"].as_array().or_fail("packages")? {
        let id = package["id"].as_str().unwrap_or_default();
        let name = package["name"].as_str().unwrap_or_default();
        let rust = package["rust_version"].as_str();
        if members.contains(&id) {
            let rust = rust.or_fail(format!("{name} declares a rust-version"))?;
            match declared {
                None => declared = Some(rust),
                Some(d) => assert_eq!(d, rust, "{name} declares another rust-version"),
            }
        }
    }
    let declared = version(declared.or_fail("the workspace has members")?)?;
    for package in meta["packages"].as_array().or_fail("packages")? {
        let name = package["name"].as_str().unwrap_or_default().to_string();
        let release = package["version"].as_str().unwrap_or_default().to_string();
        if !built.contains(&(name, release)) {
            continue;
        }
        checked += 1;
        if let Some(rust) = package["rust_version"].as_str() {
            if version(rust)? > declared {
                too_new.push(format!(
                    "{} {} needs {rust}",
                    package["name"], package["version"]
                ));
            }
        }
    }
    assert!(checked > 100, "only {checked} packages were resolved");
    assert!(
        too_new.is_empty(),
        "rust-version {declared:?} is declared, but: {too_new:?}"
    );
    Ok(())
}
