//! One shard: a stack instance on one device queue, driven by a busy-poll loop on its own
//! core — receive a batch, run the stack and the timers, serve the connections, transmit a
//! batch. The loop takes no lock and allocates nothing per packet: frames are recycled
//! between device and stack, sessions are allocated once per connection, and figures are
//! published through atomics (counters with a `try_lock` every [`PUBLISH_EVERY`]).
//!
//! With [`IdlePolicy::Park`], after [`IDLE_SPINS`] turns without any work the loop parks in
//! poll(2) on the device's descriptor for at most [`IDLE_WAIT`], so an idle shard does not
//! burn its core; under load it never sleeps. With [`IdlePolicy::Spin`] it never parks.

use super::services::{Bulk, ServiceSpec, Session, Verdict};
use crate::device::Device;
use hoststack_runner_api::{IdlePolicy, QueueDrops, RxWait, StopStats};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use userstack::counters::Counters;
use userstack::stack::{Event, SocketHandle, Stack};
use userstack::tcp::State;
use userstack::time::Instant;

/// Frames per receive batch.
pub const BATCH: usize = 64;
/// Empty turns before the loop parks.
pub const IDLE_SPINS: u32 = 4096;
/// The longest park (the stack's timers have millisecond granularity).
pub const IDLE_WAIT: Duration = Duration::from_millis(1);
/// How often counters are published.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(100);
/// Output a session may hold beyond the stack's send buffer before it stops reading.
const OUTPUT_LIMIT: usize = 256 * 1024;

/// What the runtime tells its shards.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Phase {
    /// Serve.
    Running = 0,
    /// Stop accepting, finish open connections, reset what is left at the deadline.
    Draining = 1,
}

/// Shared between the runtime and every shard.
#[derive(Debug)]
pub struct Control {
    phase: AtomicU8,
    drain_timeout: Duration,
}

impl Control {
    /// Running, with the given graceful-stop deadline.
    pub fn new(drain_timeout: Duration) -> Control {
        Control {
            phase: AtomicU8::new(Phase::Running as u8),
            drain_timeout,
        }
    }

    /// Tells the shards to drain.
    pub fn drain(&self) {
        self.phase.store(Phase::Draining as u8, Ordering::Release);
    }

    fn phase(&self) -> Phase {
        if self.phase.load(Ordering::Acquire) == Phase::Draining as u8 {
            Phase::Draining
        } else {
            Phase::Running
        }
    }
}

/// One shard's figures, written by the shard and read by the runtime.
#[derive(Debug, Default)]
pub struct ShardFigures {
    /// The shard is up (listening).
    pub up: AtomicBool,
    /// The shard has stopped.
    pub finished: AtomicBool,
    /// Frames received.
    pub rx_packets: AtomicU64,
    /// Frames sent.
    pub tx_packets: AtomicU64,
    /// Open connections.
    pub connections: AtomicU64,
    /// Connections closed gracefully while draining.
    pub drained: AtomicU64,
    /// Connections reset at the drain deadline.
    pub reset: AtomicU64,
    /// Nanoseconds of the loop spent in turns that did something, as last published.
    pub busy_nanos: AtomicU64,
    /// Nanoseconds the loop has run, as last published.
    pub run_nanos: AtomicU64,
    /// The stack's counters as last published.
    pub counters: Mutex<Counters>,
    /// The device queue's drop counters as last published, where it keeps them.
    pub drops: Mutex<Option<QueueDrops>>,
    /// How long received frames waited, as last published, where the device can tell.
    pub rx_wait: Mutex<Option<RxWait>>,
}

impl ShardFigures {
    /// The stop figures, once the shard began stopping.
    pub fn stop(&self) -> StopStats {
        StopStats {
            drained: self.drained.load(Ordering::Relaxed),
            reset: self.reset.load(Ordering::Relaxed),
        }
    }
}

/// How much of the loop's time went to turns that did something: a turn's time runs from its
/// clock read to the next turn's, so this takes no clock read of its own.
#[derive(Debug, Default)]
struct Load {
    busy_nanos: u64,
    /// The start of the last turn, if it did something.
    busy_since: Option<Instant>,
}

impl Load {
    /// A turn began at `now` and did something or not.
    fn turned(&mut self, now: Instant, work: bool) {
        if let Some(since) = self.busy_since {
            self.busy_nanos += (now - since).as_nanos() as u64;
        }
        self.busy_since = work.then_some(now);
    }
}

/// One served connection.
#[derive(Debug)]
struct Served {
    session: Session,
    output: Vec<u8>,
    sent: usize,
    /// The service wants the connection closed once its output is out.
    closing: bool,
    /// Our FIN is queued.
    shut: bool,
    ended: bool,
}

impl Served {
    fn new(session: Session) -> Served {
        Served {
            session,
            output: Vec::new(),
            sent: 0,
            closing: false,
            shut: false,
            ended: false,
        }
    }
}

/// A stack on a device with its services.
pub struct Shard {
    stack: Stack,
    device: Box<dyn Device + Send>,
    services: Vec<(u16, ServiceSpec)>,
    served: HashMap<SocketHandle, Served>,
    active: Vec<SocketHandle>,
    next_active: Vec<SocketHandle>,
    rx: Vec<Vec<u8>>,
    tx: Vec<Vec<u8>>,
    events: Vec<Event>,
    draining: bool,
    /// Connections that closed gracefully while draining.
    drained: u64,
    idle: IdlePolicy,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("services", &self.services)
            .field("served", &self.served.len())
            .finish_non_exhaustive()
    }
}

impl Shard {
    /// A shard serving `services` with `stack` on `device`, listening at once, sending in
    /// bulk on `clients`, connections `stack` has opened, and waiting as `idle` says.
    pub fn new(
        mut stack: Stack,
        device: Box<dyn Device + Send>,
        services: Vec<(u16, ServiceSpec)>,
        clients: &[SocketHandle],
        idle: IdlePolicy,
    ) -> Result<Shard, String> {
        for (port, _) in &services {
            stack
                .listen(*port, 4096)
                .map_err(|e| format!("listening on port {port}: {e:?}"))?;
        }
        let mut served = HashMap::with_capacity(4096);
        let mut active = Vec::with_capacity(4096);
        for &handle in clients {
            served.insert(handle, Served::new(Session::Bulk(Bulk)));
            active.push(handle);
        }
        Ok(Shard {
            stack,
            device,
            services,
            served,
            active,
            next_active: Vec::with_capacity(4096),
            rx: Vec::with_capacity(BATCH),
            tx: Vec::with_capacity(4 * BATCH),
            events: Vec::with_capacity(4096),
            draining: false,
            drained: 0,
            idle,
        })
    }

    /// Runs until drained: serves while `control` says running, then drains until every
    /// connection closed or the deadline passed, resetting the rest.
    pub fn run(mut self, control: &Control, figures: &ShardFigures, epoch: std::time::Instant) {
        let clock = || Instant::from_nanos(epoch.elapsed().as_nanos() as u64);
        figures.up.store(true, Ordering::Release);
        let mut idle = 0u32;
        let started = clock();
        let mut last_publish = started;
        let mut load = Load::default();
        let mut drain_deadline: Option<Instant> = None;
        loop {
            let now = clock();
            let work = self.turn(now, figures);
            load.turned(now, work);
            if now - last_publish >= PUBLISH_EVERY {
                last_publish = now;
                self.publish(figures, &load, now - started);
            }
            if drain_deadline.is_none() && control.phase() == Phase::Draining {
                drain_deadline = Some(now + control.drain_timeout);
                self.begin_drain();
            }
            if let Some(deadline) = drain_deadline {
                figures.drained.store(self.drained, Ordering::Relaxed);
                if self.served.is_empty() {
                    break;
                }
                if now >= deadline {
                    self.reset_remaining(figures);
                    break;
                }
            }
            if work {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
                if idle >= IDLE_SPINS && self.idle == IdlePolicy::Park {
                    self.park();
                }
            }
        }
        // Let the last FINs and RSTs out.
        let now = clock();
        self.turn(now, figures);
        self.publish(figures, &load, now - started);
        figures.drained.store(self.drained, Ordering::Relaxed);
        figures.finished.store(true, Ordering::Release);
    }

    /// One turn of the loop; whether anything happened.
    fn turn(&mut self, now: Instant, figures: &ShardFigures) -> bool {
        self.device.receive(&mut self.rx, BATCH);
        let received = self.rx.len();
        self.stack.ingress(now, &mut self.rx);
        self.stack.poll_timers(now);
        let served = self.serve();
        self.stack.egress(now, &mut self.tx);
        let sent = self.tx.len();
        if sent > 0 {
            self.device.transmit(&mut self.tx);
        }
        if received > 0 {
            figures
                .rx_packets
                .fetch_add(received as u64, Ordering::Relaxed);
        }
        if sent > 0 {
            figures.tx_packets.fetch_add(sent as u64, Ordering::Relaxed);
        }
        received > 0 || sent > 0 || served
    }

    fn park(&self) {
        match self.device.wait_fd() {
            Some(fd) => {
                let mut pollfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pollfd, 1, IDLE_WAIT.as_millis() as libc::c_int) };
            }
            None => std::thread::sleep(IDLE_WAIT),
        }
    }

    fn publish(&self, figures: &ShardFigures, load: &Load, ran: Duration) {
        figures
            .connections
            .store(self.served.len() as u64, Ordering::Relaxed);
        figures.busy_nanos.store(load.busy_nanos, Ordering::Relaxed);
        figures
            .run_nanos
            .store(ran.as_nanos() as u64, Ordering::Relaxed);
        if let Ok(mut counters) = figures.counters.try_lock() {
            *counters = self.stack.counters();
        }
        if let Ok(mut drops) = figures.drops.try_lock() {
            *drops = self.device.drops();
        }
        if let Ok(mut published) = figures.rx_wait.try_lock() {
            // Into the buffers of the last publication: the loop does not allocate.
            match (published.as_mut(), self.device.rx_wait()) {
                (Some(published), Some(now)) => published.clone_from(now),
                (_, now) => *published = now.cloned(),
            }
        }
    }

    /// Accepts and serves; whether any connection made progress.
    fn serve(&mut self) -> bool {
        self.stack.poll_events(&mut self.events);
        let mut progress = !self.events.is_empty();
        let mut events = std::mem::take(&mut self.events);
        for event in events.drain(..) {
            match event {
                Event::Acceptable(port) => {
                    let Some(spec) = self
                        .services
                        .iter()
                        .find(|(p, _)| *p == port)
                        .map(|(_, s)| s.clone())
                    else {
                        continue;
                    };
                    while let Some(handle) = self.stack.accept(port) {
                        self.served.insert(handle, Served::new(spec.session()));
                        self.active.push(handle);
                    }
                }
                Event::Ready(handle, _) => self.active.push(handle),
            }
        }
        self.events = events;
        let mut active = std::mem::take(&mut self.active);
        active.sort_unstable();
        active.dedup();
        for handle in active.drain(..) {
            progress |= self.serve_one(handle);
        }
        self.active = std::mem::take(&mut self.next_active);
        self.next_active = active;
        progress
    }

    /// Moves bytes between one connection and its session; keeps it active while it has
    /// output queued or input unread.
    fn serve_one(&mut self, handle: SocketHandle) -> bool {
        let Some(served) = self.served.get_mut(&handle) else {
            return false;
        };
        let stack = &mut self.stack;
        let mut progress = false;
        let state = stack.connection(handle).map(|c| c.state());
        if matches!(state, None | Some(State::Closed)) {
            // Reset by the peer or timed out.
            let _ = stack.close(handle);
            self.served.remove(&handle);
            return true;
        }
        loop {
            progress |= flush(stack, handle, served);
            if served.closing || served.output.len() - served.sent > OUTPUT_LIMIT {
                break;
            }
            let (n, verdict) = served.session.take_input(stack, handle, &mut served.output);
            if n == 0 {
                break;
            }
            progress = true;
            if verdict == Verdict::Close {
                served.closing = true;
            }
        }
        let finished = stack
            .connection(handle)
            .is_some_and(|c| c.is_recv_finished());
        if finished && !served.ended {
            served.ended = true;
            progress = true;
            if served.session.on_end(&mut served.output) == Verdict::Close {
                served.closing = true;
            }
            flush(stack, handle, served);
        }
        if served.closing && served.sent == served.output.len() && !served.shut {
            served.shut = true;
            progress = true;
            let _ = stack.shutdown(handle);
        }
        let state = stack.connection(handle).map(|c| c.state());
        if served.shut && matches!(state, None | Some(State::Closed | State::TimeWait)) {
            let _ = stack.close(handle);
            self.served.remove(&handle);
            if self.draining {
                self.drained += 1;
            }
            return true;
        }
        if !served.closing && served.sent == served.output.len() {
            progress |= served.session.refill(stack, handle) > 0;
        }
        let readable = stack.connection(handle).is_some_and(|c| c.recv_queue() > 0);
        if served.sent < served.output.len() || (readable && !served.closing) {
            self.next_active.push(handle);
        }
        progress
    }

    /// Stops accepting and asks every connection to finish: listeners go (connections not
    /// yet accepted are reset by the stack), and each served connection closes once its
    /// output is out.
    fn begin_drain(&mut self) {
        self.draining = true;
        for (port, _) in &self.services {
            self.stack.unlisten(*port);
        }
        for (handle, served) in &mut self.served {
            served.closing = true;
            self.active.push(*handle);
        }
    }

    fn reset_remaining(&mut self, figures: &ShardFigures) {
        for (handle, _) in self.served.drain() {
            let _ = self.stack.abort(handle);
            figures.reset.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sends as much queued output as the stack takes; whether any was taken.
fn flush(stack: &mut Stack, handle: SocketHandle, served: &mut Served) -> bool {
    if served.sent == served.output.len() {
        return false;
    }
    let n = stack
        .send(handle, &served.output[served.sent..])
        .unwrap_or(0);
    served.sent += n;
    if served.sent == served.output.len() {
        served.output.clear();
        served.sent = 0;
    }
    n > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_counts_the_time_of_turns_that_did_something() {
        let at = |ms: u64| Instant::from_nanos(ms * 1_000_000);
        let mut load = Load::default();
        for (ms, work) in [(0, true), (10, false), (15, true), (25, true), (40, false)] {
            load.turned(at(ms), work);
        }
        // 0-10 and 15-40 busy; 10-15 idle; the last turn's length is not known yet.
        assert_eq!(load.busy_nanos, 35_000_000);
    }
}
