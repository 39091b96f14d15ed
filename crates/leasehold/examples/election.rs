//! Leader election with fenced epochs: three nodes campaign, one leads at a time, an observer
//! follows who leads, and a follower refuses the commands of a leader that was deposed while it
//! was paused.
//!
//! ```text
//! cargo run -p leasehold --features sqlite --example election
//! cargo run -p leasehold --features full --example election -- etcd://127.0.0.1:2379
//! ```
//!
//! Without an argument the authority is an embedded SQLite file in a fresh temporary directory;
//! with one, any URL `leasehold::connect` takes. Each node has its own client, as separate
//! processes would.
//!
//! What happens:
//!
//! 1. `node-a`, `node-b` and `node-c` campaign. One of them (say `node-a`) is elected; its
//!    **epoch** is its lease's fence. It proclaims its address, and the observer prints it.
//! 2. The leader sends commands to a follower. The follower keeps the greatest epoch it has
//!    accepted (a `FencedRegister`; in a real system, a column or a field in the follower's
//!    state) and refuses any command with an older one.
//! 3. The first leader then *pauses* (in this example: it stops renewing, as a process in a long
//!    GC pause or a stopped VM would), with one command already prepared. Its lease runs out at
//!    the authority, the next node is elected with a greater epoch and commands the follower.
//! 4. The paused leader wakes and sends its prepared command. It still believes it leads (it
//!    checked before the pause), but the follower has seen a newer epoch and refuses it.
//! 5. The second leader resigns; the third is elected at once; everyone finishes.
//!
//! The election alone could not stop the late command: nothing keeps a process from pausing
//! between its check and its send. The epoch, checked where the command lands, does.
//!
//! The example exits non-zero unless the late command was refused, epochs grew with every
//! leader, and the observer saw each one.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold::{
    connect, Authority, Election, FencedRegister, FencedResource, Guarded, Leadership,
    LeaseOptions, LockKey,
};
use tokio::sync::{mpsc, Mutex};

const TTL: Duration = Duration::from_secs(1);

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = std::error::Error::source(&*e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

async fn client(url: &str) -> Result<Arc<dyn Authority>, Box<dyn std::error::Error>> {
    Ok(connect(url).await?)
}

async fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = match std::env::args().nth(1) {
        Some(url) => url,
        None => format!("sqlite://{}/election.db", dir.path().display()),
    };
    let key = LockKey::new(format!("example/election/{}", std::process::id()))?;
    let follower = Arc::new(FencedRegister::new());

    // The observer prints every change of leader until told to stop.
    let mut observer = Election::new(client(&url).await?, &key)
        .observe()
        .with_interval(Duration::from_millis(100));
    let (stop_tx, mut stop_rx) = mpsc::channel::<()>(1);
    let watching = tokio::spawn(async move {
        let mut seen = Vec::new();
        loop {
            tokio::select! {
                _ = stop_rx.recv() => return Ok::<_, leasehold::Error>(seen),
                next = observer.next() => match next? {
                    Some(leader) => {
                        println!("observer: {leader}");
                        if leader.value.is_some() && !seen.contains(&leader.epoch.value()) {
                            seen.push(leader.epoch.value());
                        }
                    }
                    None => println!("observer: nobody leads"),
                },
            }
        }
    });

    // The first leader will pause: its lease is not renewed (a paused process renews nothing).
    let paused_options = LeaseOptions::default().with_auto_renew(false);
    let mut candidates = Vec::new();
    for (i, name) in ["node-a", "node-b", "node-c"].into_iter().enumerate() {
        let election = Election::new(client(&url).await?, &key)
            .with_value(format!("{name}.internal:7000"))?
            .with_lease_options(if i == 0 {
                paused_options.clone()
            } else {
                LeaseOptions::default()
            });
        candidates.push((name, election));
    }

    // node-a campaigns first, so the story is the same on every run.
    let mut candidates = candidates.into_iter();
    let (first_name, first) = candidates.next().ok_or("no candidates")?;
    let leader_a = first.campaign(TTL, TTL * 5).await?;
    println!("{first_name}: elected with epoch {}", leader_a.epoch());
    command(&follower, first_name, &leader_a, "set replicas = 3").await?;
    // The command it prepares, then the pause.
    leader_a.ensure_valid()?;
    let prepared = leader_a.epoch();
    println!("{first_name}: prepared `drop table users` under epoch {prepared}, then paused");

    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (name, election) in candidates {
        let (follower, order) = (follower.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let leadership = election.campaign(TTL, TTL * 10).await?;
            println!("{name}: elected with epoch {}", leadership.epoch());
            order.lock().await.push(leadership.epoch().value());
            command(&follower, name, &leadership, &format!("hello from {name}")).await?;
            tokio::time::sleep(TTL).await;
            let _ = leadership.resign().await?;
            println!("{name}: resigned");
            Ok::<_, leasehold::Error>(())
        }));
    }
    // Let node-a's lease run out, and a new leader command the follower, before it wakes.
    tokio::time::sleep(TTL * 2).await;
    let late = follower.write(prepared, "drop table users").await?;
    let refused = matches!(late, Guarded::Stale { .. });
    match late {
        Guarded::Stale { newest } => println!(
            "{first_name}: woke up and sent `drop table users` with epoch {prepared}: REFUSED, \
             the follower has seen epoch {newest}"
        ),
        Guarded::Accepted => println!("{first_name}: its late command was ACCEPTED"),
    }
    println!(
        "{first_name}: ensure_valid() now says: {}",
        match leader_a.ensure_valid() {
            Ok(()) => "still leading".to_string(),
            Err(e) => e.to_string(),
        }
    );
    drop(leader_a);
    for task in tasks {
        task.await??;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let _ = stop_tx.send(()).await;
    let seen = watching.await??;
    let order = order.lock().await.clone();
    let grew = std::iter::once(prepared.value())
        .chain(order.iter().copied())
        .collect::<Vec<_>>()
        .windows(2)
        .all(|w| w[0] < w[1]);
    let observed = seen.len() == 3;
    println!(
        "epochs in election order: {:?}; the observer saw {} leaders with their values",
        std::iter::once(prepared.value())
            .chain(order)
            .collect::<Vec<_>>(),
        seen.len()
    );
    if refused && grew && observed {
        println!("the deposed leader's command was refused; one leader at a time.");
        Ok(true)
    } else {
        println!("FAILED: refused={refused} epochs_grew={grew} observed_all={observed}");
        Ok(false)
    }
}

/// Sends a command to the follower under the leader's epoch, checking leadership first.
async fn command(
    follower: &FencedRegister,
    name: &str,
    leadership: &Leadership,
    what: &str,
) -> leasehold::Result<()> {
    leadership.ensure_valid()?;
    match follower.write(leadership.epoch(), what).await? {
        Guarded::Accepted => println!("{name}: `{what}` accepted (epoch {})", leadership.epoch()),
        Guarded::Stale { newest } => {
            println!("{name}: `{what}` refused, the follower has seen epoch {newest}")
        }
    }
    Ok(())
}
