//! The fast path allocates nothing per packet: two stacks on one thread move 64 MiB in bulk
//! and 20,000 request/response transactions after a warm-up, and a counting global allocator
//! counts the allocations made meanwhile (the count is asserted, never a time). Both ways of
//! driving the pair are proven: both stacks transmitting then both receiving (`Pair::step`),
//! and each stack in turn receiving then transmitting, as an event loop does
//! (`Pair::poll_round`, where timers are re-armed once per transaction).

#[path = "support/pair.rs"]
mod pair;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use pair::Pair;
use userstack::stack::{Event, SocketHandle};
use userstack::tcp::Config;

/// How a round of the pair is driven: `Pair::step` or `Pair::poll_round`.
type Round = fn(&mut Pair) -> usize;

/// The shared pair, with the readiness events polled after every round as the runner polls
/// them, and the frames moved counted.
struct Polled {
    pair: Pair,
    round: Round,
    events: Vec<Event>,
    frames: u64,
}

impl Polled {
    fn new(round: Round) -> Polled {
        let mut pair = Pair::new(Config {
            recv_buffer: 1 << 20,
            send_buffer: 1 << 20,
            ..Config::default()
        });
        pair.b.listen(80, 16).expect("listen");
        pair.b.listen(81, 16).expect("listen");
        Polled {
            pair,
            round,
            events: Vec::with_capacity(64),
            frames: 0,
        }
    }

    fn step(&mut self) {
        self.frames += (self.round)(&mut self.pair) as u64;
        for stack in [&mut self.pair.a, &mut self.pair.b] {
            self.events.clear();
            stack.poll_events(&mut self.events);
        }
    }

    /// Moves `bytes` from a to b.
    fn bulk(
        &mut self,
        (client, server): (SocketHandle, SocketHandle),
        bytes: usize,
        data: &[u8],
        sink: &mut [u8],
    ) {
        let (mut sent, mut got) = (0, 0);
        while got < bytes {
            if sent < bytes {
                let n = (bytes - sent).min(data.len());
                sent += self.pair.a.send(client, &data[..n]).unwrap();
            }
            self.step();
            while let Ok(n) = self.pair.b.recv(server, sink) {
                if n == 0 {
                    break;
                }
                got += n;
            }
        }
    }

    /// `count` 64-byte requests answered by 64-byte responses.
    fn request_response(
        &mut self,
        (client, server): (SocketHandle, SocketHandle),
        count: u32,
        sink: &mut [u8],
    ) {
        let message = [7u8; 64];
        for _ in 0..count {
            self.pair.a.send(client, &message).unwrap();
            let mut got = 0;
            while got < 64 {
                self.step();
                got += self.pair.b.recv(server, sink).unwrap();
            }
            self.pair.b.send(server, &message).unwrap();
            let mut back = 0;
            while back < 64 {
                self.step();
                back += self.pair.a.recv(client, sink).unwrap();
            }
        }
    }
}

#[test]
fn steady_bulk_and_request_response_allocate_nothing_per_packet() {
    // One after the other in one test: the allocation counter is global, and tests in one
    // binary run on parallel threads.
    let orders: [(&str, Round); 2] = [("step", Pair::step), ("poll_round", Pair::poll_round)];
    for (name, round) in orders {
        let rounds = measured_rounds(round);
        println!("{{\"order\": \"{name}\", \"rounds\": {rounds:?}}}");
        for &(frames, allocations) in &rounds {
            assert!(frames > 80_000, "{name}: only {frames} frames moved");
            assert!(
                allocations <= 2,
                "{name}: {allocations} allocations over {frames} frames"
            );
        }
        assert_eq!(
            rounds[1].1, 0,
            "{name}: the second round allocated: {rounds:?}"
        );
    }
}

/// A warm-up, then two identical rounds of bulk and request/response driven by `round`: a
/// growth that happens once (a queue reaching a new largest size) may fall in the first;
/// anything per packet shows in both. (frames, allocations) per round.
fn measured_rounds(round: Round) -> Vec<(u64, u64)> {
    let mut pair = Polled::new(round);
    let data = vec![0x42u8; 256 * 1024];
    let mut sink = vec![0u8; 256 * 1024];
    let bulk = pair.pair.connect(80);
    let rr = pair.pair.connect(81);
    // Warm-up: buffers grow to their working size, the pools fill, the tables settle.
    pair.bulk(bulk, 16 << 20, &data, &mut sink);
    pair.request_response(rr, 2_000, &mut sink);
    (0..2)
        .map(|_| {
            let (allocations, frames) = (counting_alloc::allocations(), pair.frames);
            pair.bulk(bulk, 64 << 20, &data, &mut sink);
            pair.request_response(rr, 20_000, &mut sink);
            (
                pair.frames - frames,
                counting_alloc::allocations() - allocations,
            )
        })
        .collect()
}
