//! Runs of the suite that the SQL backends' tests make alike: the whole suite where only the
//! failover is left to another test, and the stale-write scenarios against a resource in the
//! same database.

use super::TestResult;
use crate::scenarios::{self, run_all, run_selected};
use crate::{Context, Verdict};

/// Runs the whole suite on `ctx` and requires every scenario to pass outright (not merely as a
/// declared weakness, nor as not applicable), but the failover scenario, which needs a replica
/// this deployment does not have: another test runs it.
pub async fn passes_all_but_failover(subject: &str, ctx: &Context) -> TestResult {
    let report = run_all(subject, ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in &report.lines {
        if line.scenario != "fences_survive_failover" && line.outcome != Ok(Verdict::Passed) {
            return Err(format!("{}: {:?}\n{report}", line.scenario, line.outcome).into());
        }
    }
    Ok(())
}

/// Runs the stale-write scenarios and `contention` on `ctx`, whose resources are the backend's
/// own (registers in the lease table's database, guarded as the backend's gate guards them):
/// each must pass.
pub async fn stale_writes_are_refused(subject: &str, ctx: &Context) -> TestResult {
    let selected: Vec<_> = scenarios::all()
        .into_iter()
        .filter(|s| s.name.starts_with("stale_write") || s.name == "contention")
        .collect();
    if selected.len() != 3 {
        return Err(format!("{} stale-write scenarios, 3 expected", selected.len()).into());
    }
    let report = run_selected(subject, ctx, &selected).await;
    println!("{report}");
    if !report
        .lines
        .iter()
        .all(|l| l.outcome == Ok(Verdict::Passed))
    {
        return Err(format!("a stale write was not refused:\n{report}").into());
    }
    Ok(())
}
