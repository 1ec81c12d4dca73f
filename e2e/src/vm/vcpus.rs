//! Where a guest's vCPUs are: each one's instruction pointer and halt state from qemu's
//! `info registers -a`, named by the kernel's text symbols as an earlier guest of the same
//! kernel listed them in `/proc/kallsyms` (the guest boots with `nokaslr`, so the addresses are
//! the same at every boot). Read when a guest does not come up, so that a kernel that stops
//! during boot says where.

/// One vCPU as `info registers -a` shows it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct VcpuPlace {
    /// The vCPU's index (`CPU#n`).
    pub cpu: u32,
    /// Its instruction pointer (`RIP=`).
    pub rip: u64,
    /// Whether it is halted (`HLT=1`): idle, waiting for an interrupt.
    pub halted: bool,
}

/// The vCPUs of `info registers -a`'s output, in its order; a vCPU without a `RIP=` is left
/// out.
pub(crate) fn parse(registers: &str) -> Vec<VcpuPlace> {
    let mut places = Vec::new();
    let mut cpu = None;
    for line in registers.lines() {
        if let Some(n) = line.trim().strip_prefix("CPU#") {
            cpu = n.trim().parse().ok();
            continue;
        }
        let Some(index) = cpu else { continue };
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix(name))
                .map(str::to_string)
        };
        if let Some(rip) = field("RIP=").and_then(|r| u64::from_str_radix(&r, 16).ok()) {
            places.push(VcpuPlace {
                cpu: index,
                rip,
                halted: field("HLT=").as_deref() == Some("1"),
            });
            cpu = None;
        }
    }
    places
}

/// `address` as `function+0xoffset` by the text symbols (`t`/`T`) of a symbol listing
/// (`/proc/kallsyms`, System.map's format): the nearest one at or below it; `None` below the
/// first.
pub(crate) fn symbolize(symbols: &str, address: u64) -> Option<String> {
    symbols
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let start = u64::from_str_radix(words.next()?, 16).ok()?;
            let kind = words.next()?;
            let name = words.next()?;
            matches!(kind, "t" | "T").then_some((start, name))
        })
        .filter(|(start, _)| *start <= address)
        .max_by_key(|(start, _)| *start)
        .map(|(start, name)| format!("{name}+{:#x}", address - start))
}

/// One line per vCPU: its index, instruction pointer, symbol (when `symbols` name it) and
/// whether it is halted.
pub(crate) fn describe(places: &[VcpuPlace], symbols: Option<&str>) -> String {
    places
        .iter()
        .map(|place| {
            let symbol = symbols
                .and_then(|symbols| symbolize(symbols, place.rip))
                .map(|s| format!(" {s}"))
                .unwrap_or_default();
            let state = if place.halted { "halted" } else { "running" };
            format!("vCPU {} at {:#x}{symbol}, {state}", place.cpu, place.rip)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `info registers -a` as qemu 7.2 prints it, abridged to the lines read.
    const REGISTERS: &str = "\
CPU#0
RAX=0000000000000000 RBX=ffffffff82a1a940 RCX=0000000000000001 RDX=0000000000000000
RIP=ffffffff81c3a5e2 RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=1
ES =0000 0000000000000000 00000000 00000000

CPU#1
RAX=0000000000000001 RBX=0000000000000000 RCX=0000000000000000 RDX=0000000000000000
RIP=ffffffff81047a10 RFL=00000202 [-------] CPL=0 II=0 A20=1 SMM=0 HLT=0
";

    /// `/proc/kallsyms`, abridged.
    const SYMBOLS: &str = "\
0000000000000000 A fixed_percpu_data
ffffffff81000000 T _stext
ffffffff81047a00 t delay_tsc
ffffffff81047a80 T native_calibrate_tsc
ffffffff81c3a5d0 T default_idle
ffffffff81c3a5e8 D some_data
";

    #[test]
    fn each_vcpu_has_its_instruction_pointer_and_halt_state() {
        assert_eq!(
            parse(REGISTERS),
            vec![
                VcpuPlace {
                    cpu: 0,
                    rip: 0xffff_ffff_81c3_a5e2,
                    halted: true
                },
                VcpuPlace {
                    cpu: 1,
                    rip: 0xffff_ffff_8104_7a10,
                    halted: false
                },
            ]
        );
        assert_eq!(parse("(the monitor printed nothing)"), vec![]);
    }

    #[test]
    fn an_address_is_named_by_the_nearest_text_symbol_below_it() {
        assert_eq!(
            symbolize(SYMBOLS, 0xffff_ffff_8104_7a10).as_deref(),
            Some("delay_tsc+0x10")
        );
        assert_eq!(
            symbolize(SYMBOLS, 0xffff_ffff_81c3_a5f0).as_deref(),
            Some("default_idle+0x20"),
            "data symbols do not name code"
        );
        assert_eq!(symbolize(SYMBOLS, 0xffff_ffff_8000_0000), None);
    }

    #[test]
    fn the_description_names_each_vcpu_with_or_without_a_map() {
        let places = parse(REGISTERS);
        assert_eq!(
            describe(&places, Some(SYMBOLS)),
            "vCPU 0 at 0xffffffff81c3a5e2 default_idle+0x12, halted\n\
             vCPU 1 at 0xffffffff81047a10 delay_tsc+0x10, running"
        );
        assert_eq!(
            describe(&places[1..], None),
            "vCPU 1 at 0xffffffff81047a10, running"
        );
    }
}
