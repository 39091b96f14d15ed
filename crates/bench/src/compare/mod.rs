//! `leasehold-bench compare [--backends redis,etcd,zookeeper,postgres] [--quick] [--plots DIR]
//! [--workers 2,8,32] [--keys 1,100] [--seconds 3] [--park-ms 5]`:
//! leasehold against each backend's best-known peer recipe, on the same server in the same
//! run: the uncontended pair, the hand-off, contended throughput with workers in separate
//! processes, and how long a killed holder keeps the key. Prints a side-by-side table and
//! writes `target/compare/compare.{csv,json,md}` and two SVG charts (to `--plots DIR` as well
//! when given). Figures are printed, never asserted.

mod exclusion;
mod locker;
mod measure;
mod plot;
mod report;
pub mod worker;

use std::path::PathBuf;
use std::time::Duration;

use locker::Side;
use report::Report;

use crate::BoxError;

/// Every backend with a peer recipe, in the order they run.
pub const BACKENDS: [&str; 4] = ["redis", "etcd", "zookeeper", "postgres"];

/// What the command line asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompareOptions {
    pub backends: Vec<String>,
    pub quick: bool,
    /// A folder to write the charts to as well (the documentation's).
    pub plots: Option<PathBuf>,
    /// The grid's worker counts, key counts and window, when set apart from the default's.
    pub workers: Option<Vec<u32>>,
    pub keys: Option<Vec<u32>>,
    pub seconds: Option<u64>,
    /// How long the hand-off's waiter waits before the holder releases.
    pub park: Duration,
}

/// A comma-separated list of positive numbers.
fn numbers(list: Option<&String>, what: &str) -> Result<Vec<u32>, BoxError> {
    let list = list.ok_or_else(|| format!("{what} needs a list of numbers"))?;
    let parsed: Vec<u32> = list
        .split(',')
        .map(|n| n.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what} {list}: {e}"))?;
    if parsed.is_empty() || parsed.contains(&0) {
        return Err(format!("{what} needs positive numbers, got {list}").into());
    }
    Ok(parsed)
}

/// The contended grid: worker processes and keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grid {
    pub workers: Vec<u32>,
    pub keys: Vec<u32>,
    /// How long each cell's window lasts.
    pub window: Duration,
}

impl CompareOptions {
    /// Reads the arguments after `compare`.
    pub fn parse(args: &[String]) -> Result<CompareOptions, BoxError> {
        let mut o = CompareOptions {
            backends: BACKENDS.iter().map(|b| b.to_string()).collect(),
            quick: false,
            plots: None,
            workers: None,
            keys: None,
            seconds: None,
            park: Duration::from_millis(5),
        };
        let mut args = args.iter();
        while let Some(a) = args.next() {
            match a.as_str() {
                "--quick" => o.quick = true,
                "--backends" => {
                    let list = args.next().ok_or("--backends needs a list")?;
                    let backends: Vec<String> = list
                        .split(',')
                        .map(str::trim)
                        .filter(|b| !b.is_empty())
                        .map(str::to_string)
                        .collect();
                    if let Some(unknown) = backends.iter().find(|b| !BACKENDS.contains(&b.as_str()))
                    {
                        return Err(format!(
                            "no peer recipe for {unknown}; known: {}",
                            BACKENDS.join(", ")
                        )
                        .into());
                    }
                    if backends.is_empty() {
                        return Err("--backends needs at least one backend".into());
                    }
                    o.backends = backends;
                }
                "--workers" => o.workers = Some(numbers(args.next(), "--workers")?),
                "--keys" => o.keys = Some(numbers(args.next(), "--keys")?),
                "--seconds" => {
                    let s = numbers(args.next(), "--seconds")?;
                    o.seconds = s.first().map(|&s| u64::from(s));
                }
                "--park-ms" => {
                    let ms = numbers(args.next(), "--park-ms")?;
                    o.park = Duration::from_millis(ms.first().map_or(5, |&ms| u64::from(ms)));
                }
                "--plots" => o.plots = Some(args.next().ok_or("--plots needs a folder")?.into()),
                other => return Err(format!("unknown compare argument {other}").into()),
            }
        }
        Ok(o)
    }

    /// The contended grid this run measures.
    pub fn grid(&self) -> Grid {
        let mut grid = self.default_grid();
        if let Some(workers) = &self.workers {
            grid.workers = workers.clone();
        }
        if let Some(keys) = &self.keys {
            grid.keys = keys.clone();
        }
        if let Some(seconds) = self.seconds {
            grid.window = Duration::from_secs(seconds);
        }
        grid
    }

    fn default_grid(&self) -> Grid {
        if self.quick {
            Grid {
                workers: vec![2, 8],
                keys: vec![1],
                window: Duration::from_secs(2),
            }
        } else {
            Grid {
                workers: vec![2, 8, 32],
                keys: vec![1, 100],
                window: Duration::from_secs(3),
            }
        }
    }
}

/// Where the run's files go: `target/compare/` (under `CARGO_TARGET_DIR` when set).
fn out_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| PathBuf::from("target"), PathBuf::from)
        .join("compare")
}

/// The processor, its count, and the load average, read from /proc.
fn machine() -> (String, String) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown processor".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    (format!("{cpu}, {cores} cores"), load())
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn today() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|d| d.trim().to_string())
        .unwrap_or_default()
}

/// The compare mode's body.
pub async fn run(o: CompareOptions) -> Result<(), BoxError> {
    let (cpu, load_before) = machine();
    let mut report = Report {
        date: today(),
        machine: cpu,
        load: String::new(),
        quick: o.quick,
        rows: Vec::new(),
    };
    println!(
        "compare: {} on {}, load average {load_before}{}",
        report.date,
        report.machine,
        if cfg!(debug_assertions) {
            " (DEBUG BUILD: use --release for real figures)"
        } else {
            ""
        }
    );
    for backend in &o.backends {
        println!(
            "== {backend}: leasehold against {}",
            locker::peer_name(backend)
        );
        let rows = measure::backend(backend, &o).await?;
        report.rows.extend(rows);
    }
    report.load = format!("{load_before} at the start, {} at the end", load());
    let dir = out_dir();
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("compare.csv"), report.csv())?;
    std::fs::write(
        dir.join("compare.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(dir.join("compare.md"), report.markdown())?;
    let throughput = plot::throughput(&report)?;
    let handoff = plot::handoff(&report)?;
    let mut folders = vec![dir.clone()];
    folders.extend(o.plots.clone());
    for folder in &folders {
        std::fs::create_dir_all(folder)?;
        std::fs::write(folder.join("compare-throughput.svg"), &throughput)?;
        std::fs::write(folder.join("compare-handoff.svg"), &handoff)?;
    }
    println!("\n{}", report.table());
    println!("load average: {}", report.load);
    let broken: Vec<_> = report
        .rows
        .iter()
        .filter(|r| r.overlaps > 0 || r.fence_disorder > 0)
        .collect();
    for r in &broken {
        println!(
            "EXCLUSION BROKEN: {} {} {:?}x{:?}: {} overlapping holds, {} fences out of order",
            r.backend, r.contestant, r.workers, r.keys, r.overlaps, r.fence_disorder
        );
    }
    println!(
        "written: {} (csv, json, md, svg){}",
        dir.display(),
        o.plots.as_ref().map_or(String::new(), |p| format!(
            "; charts also in {}",
            p.display()
        ))
    );
    Ok(())
}

/// `Side` for each measurement, in an order that alternates who goes first.
fn sides(round: usize) -> [Side; 2] {
    if round.is_multiple_of(2) {
        [Side::Leasehold, Side::Peer]
    } else {
        [Side::Peer, Side::Leasehold]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn the_full_grid_is_2_8_32_workers_by_1_and_100_keys() -> Result<(), BoxError> {
        let o = CompareOptions::parse(&[])?;
        let grid = o.grid();
        if o.backends != BACKENDS || grid.workers != [2, 8, 32] || grid.keys != [1, 100] {
            return Err(format!("default options {o:?}, grid {grid:?}").into());
        }
        Ok(())
    }

    #[test]
    fn quick_narrows_the_grid_and_backends_picks_the_backends() -> Result<(), BoxError> {
        let o = CompareOptions::parse(&args(&["--backends", "etcd, redis", "--quick"]))?;
        let grid = o.grid();
        if o.backends != ["etcd", "redis"] || grid.workers != [2, 8] || grid.keys != [1] {
            return Err(format!("quick options {o:?}, grid {grid:?}").into());
        }
        Ok(())
    }

    #[test]
    fn an_unknown_backend_or_argument_is_refused() -> Result<(), BoxError> {
        let o = CompareOptions::parse(&args(&["--quick", "--workers", "4,16", "--seconds", "5"]))?;
        let grid = o.grid();
        if grid.workers != [4, 16] || grid.keys != [1] || grid.window != Duration::from_secs(5) {
            return Err(format!("--workers and --seconds gave {grid:?}").into());
        }
        for bad in [
            &["--backends", "mysql"][..],
            &["--backends", ""],
            &["--fast"],
            &["--workers", "0"],
            &["--keys", "1,x"],
        ] {
            if CompareOptions::parse(&args(bad)).is_ok() {
                return Err(format!("{bad:?} was accepted").into());
            }
        }
        Ok(())
    }
}
