//! The reader-writer lock: never a writer beside anyone, readers share, a waiting writer blocks
//! new readers, fences grow across modes (and across an upgrade), and a cancelled writer leaves
//! nothing that blocks readers.
//!
//! Each scenario drives the lock through [`RwRecipe`], so the same scenario runs the recipe
//! ([`recipe`]) and its deliberately broken variants (`crate::recipe_mutants`), which it must
//! fail.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    Authority, Error, Instant, Lease, LeaseOptions, LockKey, ReadGuard, Result, RwLock, WriteGuard,
};

use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// A reader-writer lock as the scenarios drive it: the recipe, or a broken variant of it.
#[async_trait]
pub trait RwRecipe: Send + Sync {
    /// Takes a read hold.
    async fn read(&self, ttl: Duration, max_wait: Duration) -> Result<Hold>;
    /// Takes the write hold.
    async fn write(&self, ttl: Duration, max_wait: Duration) -> Result<Hold>;
}

/// Makes the reader-writer lock named `name` on a client.
pub type RwMaker = fn(Arc<dyn Authority>, &LockKey) -> Result<Box<dyn RwRecipe>>;

/// A hold of either mode: the recipe's guards, or a broken variant's leases with its fence.
#[derive(Debug)]
pub enum Hold {
    /// The recipe's read hold.
    Read(ReadGuard),
    /// The recipe's write hold.
    Write(WriteGuard),
    /// A broken variant's leases, and the fence it reports.
    Leases(u64, Vec<Lease>),
}

impl Hold {
    /// The hold's fence.
    pub fn fence(&self) -> u64 {
        match self {
            Hold::Read(g) => g.fence().value(),
            Hold::Write(g) => g.fence().value(),
            Hold::Leases(fence, _) => *fence,
        }
    }

    /// `Ok` while the hold is valid.
    pub fn ensure_valid(&self) -> Result<()> {
        match self {
            Hold::Read(g) => g.ensure_valid(),
            Hold::Write(g) => g.ensure_valid(),
            Hold::Leases(_, leases) => leases.iter().try_for_each(Lease::ensure_valid),
        }
    }

    /// Gives it back.
    pub async fn release(self) -> Result<()> {
        match self {
            Hold::Read(g) => g.release().await.map(|_| ()),
            Hold::Write(g) => g.release().await,
            Hold::Leases(_, leases) => {
                for lease in leases {
                    let _ = lease.release().await?;
                }
                Ok(())
            }
        }
    }
}

#[async_trait]
impl RwRecipe for RwLock {
    async fn read(&self, ttl: Duration, max_wait: Duration) -> Result<Hold> {
        RwLock::read(self, ttl, max_wait).await.map(Hold::Read)
    }
    async fn write(&self, ttl: Duration, max_wait: Duration) -> Result<Hold> {
        RwLock::write(self, ttl, max_wait).await.map(Hold::Write)
    }
}

/// The recipe itself.
pub fn recipe(authority: Arc<dyn Authority>, name: &LockKey) -> Result<Box<dyn RwRecipe>> {
    Ok(Box::new(RwLock::new(authority, name)?))
}

/// Which holds are in, as the checker counts them between a grant and its release, and every
/// grant's mode and fence in grant order.
#[derive(Default)]
struct Checker {
    readers: u32,
    writers: u32,
    overlaps: Vec<String>,
    grants: Vec<(bool, u64)>,
}

impl Checker {
    fn enter(&mut self, write: bool, fence: u64) {
        if write && (self.readers > 0 || self.writers > 0) {
            self.overlaps.push(format!(
                "a writer (fence {fence}) beside {} readers and {} writers",
                self.readers, self.writers
            ));
        }
        if !write && self.writers > 0 {
            self.overlaps
                .push(format!("a reader (fence {fence}) beside a writer"));
        }
        if write {
            self.writers += 1;
        } else {
            self.readers += 1;
        }
        self.grants.push((write, fence));
    }

    fn leave(&mut self, write: bool) {
        if write {
            self.writers = self.writers.saturating_sub(1);
        } else {
            self.readers = self.readers.saturating_sub(1);
        }
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Six tasks on their own clients take the lock four times each, a third of the times to write,
/// holding it a moment (a reader a few times as long as one read hold takes to get): a shared checker never sees a writer beside a reader or another writer,
/// some readers do share, and every writer's fence is greater than every fence granted before it.
pub async fn rw_lock_never_writer_beside_anyone(ctx: &Context) -> Outcome {
    never_writer_beside_anyone_with(ctx, recipe).await
}

/// [`rw_lock_never_writer_beside_anyone`] on the lock `make` makes.
pub async fn never_writer_beside_anyone_with(ctx: &Context, make: RwMaker) -> Outcome {
    let name = ctx.key("rw");
    let ttl = ctx.ttl();
    let checker: Arc<Mutex<Checker>> = Arc::default();
    let most_readers = Arc::new(std::sync::atomic::AtomicU32::new(0));
    // Readers hold for a few times what one read hold takes to get and give back, so that on a
    // store with slow requests the next reader still arrives while one holds.
    let probe = make(ctx.connect().await?, &name).or_fail("a reader-writer lock")?;
    let started = Instant::now();
    let hold = probe.read(ttl, ttl * 10).await.or_fail("a first reader")?;
    hold.release().await.or_fail("the first reader releases")?;
    let reading = (started.elapsed() * 2).clamp(Duration::from_millis(20), ttl / 2);
    let mut tasks = Vec::new();
    for task in 0..6u32 {
        let lock = make(ctx.connect().await?, &name).or_fail("a reader-writer lock")?;
        let (checker, most_readers) = (checker.clone(), most_readers.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..4u32 {
                let write = (task + round) % 3 == 0;
                // Writers queue behind each other and behind readers held a while: on a slow
                // store the last of them waits for many holds in turn.
                let hold = if write {
                    lock.write(ttl, ttl * 30).await?
                } else {
                    lock.read(ttl, ttl * 30).await?
                };
                {
                    let mut c = locked(&checker);
                    c.enter(write, hold.fence());
                    most_readers.fetch_max(c.readers, std::sync::atomic::Ordering::SeqCst);
                }
                let holding = if write {
                    Duration::from_millis(5)
                } else {
                    reading
                };
                tokio::time::sleep(holding).await;
                hold.ensure_valid()?;
                locked(&checker).leave(write);
                hold.release().await?;
            }
            Ok::<(), Error>(())
        }));
    }
    for task in tasks {
        task.await
            .or_fail("a contender task")?
            .or_fail("a contender")?;
    }
    let c = locked(&checker);
    ensure!(c.overlaps.is_empty(), "overlaps: {:?}", c.overlaps);
    ensure!(c.grants.len() == 24, "{} grants of 24", c.grants.len());
    let mut greatest = 0;
    for (write, fence) in &c.grants {
        ensure!(
            !*write || *fence > greatest,
            "a writer's fence {fence} is not above an earlier grant's {greatest}: {:?}",
            c.grants
        );
        greatest = greatest.max(*fence);
    }
    let most = most_readers.load(std::sync::atomic::Ordering::SeqCst);
    ensure!(
        most >= 2,
        "readers never shared the lock (at most {most} at once)"
    );
    Ok(Verdict::Passed)
}

/// Two readers on their own clients hold the lock at once: the second gets it without waiting
/// while the first holds it, and both are valid together.
pub async fn rw_lock_readers_share(ctx: &Context) -> Outcome {
    let name = ctx.key("rw-share");
    let ttl = ctx.ttl();
    let a = recipe(ctx.connect().await?, &name).or_fail("A's lock")?;
    let b = recipe(ctx.connect().await?, &name).or_fail("B's lock")?;
    let first = a.read(ttl, ttl).await.or_fail("A reads")?;
    let second = b.read(ttl, ttl / 2).await.or_fail("B reads beside A")?;
    first.ensure_valid().or_fail("A's read hold beside B")?;
    second.ensure_valid().or_fail("B's read hold beside A")?;
    first.release().await.or_fail("A releases")?;
    second.release().await.or_fail("B releases")?;
    Ok(Verdict::Passed)
}

/// A reader holds the lock; a writer waits for it. While the writer waits, a new reader does not
/// get in (it times out); once the first reader releases, the writer gets the lock soon, with a
/// fence above the reader's, and after the writer the new reader gets in.
pub async fn rw_lock_waiting_writer_blocks_new_readers(ctx: &Context) -> Outcome {
    waiting_writer_blocks_new_readers_with(ctx, recipe).await
}

/// [`rw_lock_waiting_writer_blocks_new_readers`] on the lock `make` makes.
pub async fn waiting_writer_blocks_new_readers_with(ctx: &Context, make: RwMaker) -> Outcome {
    let name = ctx.key("rw-prefer");
    let ttl = ctx.ttl();
    let first = make(ctx.connect().await?, &name).or_fail("a lock")?;
    let writer = make(ctx.connect().await?, &name).or_fail("a lock")?;
    let late = make(ctx.connect().await?, &name).or_fail("a lock")?;
    let read = first.read(ttl, ttl).await.or_fail("the first reader")?;
    let waiting = tokio::spawn(async move {
        let hold = writer.write(ttl, ttl * 10).await;
        (hold, Instant::now())
    });
    tokio::time::sleep(ttl / 2).await;
    ensure!(
        !waiting.is_finished(),
        "the writer got the lock beside a reader"
    );
    match late.read(ttl, ttl).await {
        Err(Error::Timeout { .. }) => {}
        Ok(hold) => {
            let fence = hold.fence();
            let _ = hold.release().await;
            return Err(Failure::new(format!(
                "a new reader got in (fence {fence}) while a writer waited"
            )));
        }
        Err(e) => return Err(Failure::new(format!("the new reader: {e}"))),
    }
    read.ensure_valid().or_fail("the first reader's hold")?;
    let reader_fence = read.fence();
    let released = Instant::now();
    read.release().await.or_fail("the first reader releases")?;
    let (hold, at) = waiting.await.or_fail("the writer's task")?;
    let hold = hold.or_fail("the writer")?;
    let took = at.saturating_duration_since(released);
    let bound = super::waiting::handoff_bound(ctx) + ctx.tolerance();
    ensure!(
        took <= bound,
        "the writer got the lock {took:?} after the reader left (bound {bound:?})"
    );
    ensure!(
        hold.fence() > reader_fence,
        "the writer's fence {} is not above the reader's {reader_fence}",
        hold.fence()
    );
    let writer_fence = hold.fence();
    hold.release().await.or_fail("the writer releases")?;
    let after = late
        .read(ttl, ttl)
        .await
        .or_fail("the new reader after the writer")?;
    ensure!(
        after.fence() > writer_fence,
        "a reader after the writer has fence {} <= the writer's {writer_fence}",
        after.fence()
    );
    after.release().await.or_fail("release")?;
    Ok(Verdict::Passed)
}

/// Fences grow across modes: two readers, then a writer above both, then a reader above the
/// writer; an upgradeable reader beside a plain reader, whose upgrade waits for that reader and
/// then holds a fence above every earlier one, with no writer let in between.
pub async fn rw_lock_fences_grow_across_modes(ctx: &Context) -> Outcome {
    let name = ctx.key("rw-fences");
    let ttl = ctx.ttl();
    let lock = RwLock::new(ctx.connect().await?, &name).or_fail("a lock")?;
    let other = RwLock::new(ctx.connect().await?, &name).or_fail("a lock")?;
    let r1 = lock.read(ttl, ttl).await.or_fail("reader 1")?;
    let r2 = other.read(ttl, ttl).await.or_fail("reader 2")?;
    let readers = r1.fence().value().max(r2.fence().value());
    let _ = r1.release().await.or_fail("release")?;
    let _ = r2.release().await.or_fail("release")?;
    let w = lock.write(ttl, ttl).await.or_fail("the writer")?;
    ensure!(
        w.fence().value() > readers,
        "the writer's fence {} is not above the readers' {readers}",
        w.fence().value()
    );
    let wf = w.fence().value();
    w.release().await.or_fail("release")?;
    let r3 = other.read(ttl, ttl).await.or_fail("reader 3")?;
    ensure!(
        r3.fence().value() > wf,
        "a reader after the writer has fence {} <= {wf}",
        r3.fence().value()
    );
    let up = lock
        .upgradeable_read(ttl, ttl)
        .await
        .or_fail("the upgradeable reader beside reader 3")?;
    match other.write(ttl, ttl / 4).await {
        Err(Error::Timeout { .. }) => {}
        Ok(_) => return Err(Failure::new("a writer got in beside an upgradeable reader")),
        Err(e) => {
            return Err(Failure::new(format!(
                "the writer beside the upgradeable reader: {e}"
            )))
        }
    }
    let r3f = r3.fence().value();
    let upgrading = tokio::spawn(async move { up.upgrade(ttl, ttl * 10).await });
    tokio::time::sleep(ttl / 4).await;
    ensure!(
        !upgrading.is_finished(),
        "the upgrade finished while reader 3 still held"
    );
    let _ = r3.release().await.or_fail("reader 3 releases")?;
    let upgraded = upgrading
        .await
        .or_fail("the upgrade's task")?
        .or_fail("the upgrade")?;
    ensure!(
        upgraded.fence().value() > r3f,
        "the upgraded writer's fence {} is not above reader 3's {r3f}",
        upgraded.fence().value()
    );
    match other.read(ttl, ttl / 4).await {
        Err(Error::Timeout { .. }) => {}
        Ok(_) => return Err(Failure::new("a reader got in beside the upgraded writer")),
        Err(e) => {
            return Err(Failure::new(format!(
                "a reader beside the upgraded writer: {e}"
            )))
        }
    }
    upgraded
        .release()
        .await
        .or_fail("the upgraded writer releases")?;
    let last = other
        .write(ttl, ttl)
        .await
        .or_fail("a writer after the upgrade")?;
    last.release().await.or_fail("release")?;
    Ok(Verdict::Passed)
}

/// The recipe with leases that are not released when dropped: what a dropped acquisition
/// took must still be given back.
pub fn recipe_kept_on_drop(
    authority: Arc<dyn Authority>,
    name: &LockKey,
) -> Result<Box<dyn RwRecipe>> {
    let options = LeaseOptions::default().with_release_on_drop(false);
    Ok(Box::new(
        RwLock::new(authority, name)?.with_lease_options(options),
    ))
}

/// A reader holds the lock (the holds' leases are not released on drop). A writer dropped
/// while it waits for the reader, holding the gate, gives the gate back at once: a new reader
/// gets in within half a TTL. Then a hundred write attempts are dropped at random points around
/// one round trip; once the reader leaves, a new reader and then a writer get the lock within
/// two TTLs (an attempt in flight may still create a lease, which runs out), and the gate is
/// free again.
pub async fn rw_lock_cancelled_writer_leaves_nothing(ctx: &Context) -> Outcome {
    cancelled_writer_leaves_nothing_with(ctx, recipe_kept_on_drop).await
}

/// [`rw_lock_cancelled_writer_leaves_nothing`] on the lock `make` makes.
pub async fn cancelled_writer_leaves_nothing_with(ctx: &Context, make: RwMaker) -> Outcome {
    let name = ctx.key("rw-cancel");
    let ttl = ctx.ttl();
    let reader = make(ctx.connect().await?, &name).or_fail("a lock")?;
    let writer = make(ctx.connect().await?, &name).or_fail("a lock")?;
    let held = reader.read(ttl, ttl).await.or_fail("the reader")?;
    if let Ok(got) = tokio::time::timeout(ttl / 4, writer.write(ttl, ttl * 10)).await {
        if let Ok(h) = got {
            let _ = h.release().await;
        }
        return Err(Failure::new("a writer did not wait for a reader"));
    }
    let beside = make(ctx.connect().await?, &name).or_fail("a lock")?;
    let second = beside
        .read(ttl, ttl / 2)
        .await
        .or_fail("a reader right after a writer was dropped while it waited")?;
    second.release().await.or_fail("release")?;
    if let Ok(h) = writer.write(ttl, Duration::ZERO).await {
        let _ = h.release().await;
        return Err(Failure::new("a writer got in beside a reader"));
    }
    let checker = ctx.connect().await?;
    let started = Instant::now();
    let _ = checker.inspect(&name).await.or_fail("inspect")?;
    let rtt = started.elapsed().max(Duration::from_micros(100));
    for _ in 0..100 {
        // A write's steps are a few requests each: the drops land anywhere among the first few.
        let cut = super::cancellation::cut_short(writer.write(ttl, ttl * 5), rtt * 8).await;
        if let Some(Ok(h)) = cut {
            let _ = h.release().await;
            return Err(Failure::new("a writer got in beside a reader"));
        }
    }
    held.release().await.or_fail("the reader releases")?;
    let within = ttl * 2 + ctx.tolerance();
    let other = make(ctx.connect().await?, &name).or_fail("a lock")?;
    let read = other
        .read(ttl, within)
        .await
        .or_fail("a new reader after the dropped writers")?;
    read.release().await.or_fail("release")?;
    let write = other
        .write(ttl, within)
        .await
        .or_fail("a writer after the dropped writers")?;
    write.release().await.or_fail("release")?;
    let gate = RwLock::new(checker.clone(), &name).or_fail("a lock")?;
    let seen = checker
        .inspect(gate.gate())
        .await
        .or_fail("inspect the gate")?;
    ensure!(
        !seen.held,
        "the gate is still held after every hold was released"
    );
    Ok(Verdict::Passed)
}
