//! CPU sets in the two formats the kernel prints them in: the list format (`0-3,8`, as in
//! `smp_affinity_list`, `cpu/online`, `cpu/isolated`, `node/online`) and the hex mask format
//! (`ff,00000003`, as in `rps_cpus` and `xps_cpus`). One parser per format, for every user.
//!
//! Parsing is strict: a malformed list or mask is `None`, never a guess.

use std::collections::BTreeSet;

/// Parses a CPU list strictly (`0-3,8`); `None` when malformed. An empty list is no CPU.
pub fn parse_list(list: &str) -> Option<BTreeSet<u32>> {
    let mut out = BTreeSet::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let n = part.parse::<u32>().ok()?;
                (n, n)
            }
        };
        if a > b || b - a >= 65536 {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
}

/// Formats CPUs in the kernel's list format, ranges collapsed (`0-3,8`).
pub fn format_list(cpus: &BTreeSet<u32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut iter = cpus.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    parts.join(",")
}

/// A CPU set as a kernel CPU mask: comma-separated 32-bit hex groups, most significant first,
/// the first group without leading zeros (`0` for no CPU).
pub fn cpus_to_mask(cpus: &BTreeSet<u32>) -> String {
    let Some(&max) = cpus.iter().next_back() else {
        return "0".into();
    };
    let groups = max / 32 + 1;
    (0..groups)
        .rev()
        .map(|g| {
            let word = cpus
                .iter()
                .filter(|c| **c / 32 == g)
                .fold(0u32, |w, c| w | 1 << (c % 32));
            if g == groups - 1 {
                format!("{word:x}")
            } else {
                format!("{word:08x}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The CPUs of a kernel CPU mask (`00000000,00000003` or `3`); `None` when malformed.
pub fn mask_cpus(mask: &str) -> Option<BTreeSet<u32>> {
    let mut cpus = BTreeSet::new();
    let groups: Vec<&str> = mask.trim().split(',').collect();
    for (i, group) in groups.iter().rev().enumerate() {
        if group.is_empty() || group.len() > 8 {
            return None;
        }
        let word = u32::from_str_radix(group, 16).ok()?;
        let base = u32::try_from(i).ok()?.checked_mul(32)?;
        cpus.extend((0..32).filter(|b| word & (1 << b) != 0).map(|b| base + b));
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists() {
        assert_eq!(parse_list("0-3,8"), Some([0, 1, 2, 3, 8].into()));
        assert_eq!(parse_list(" 1\n"), Some([1].into()));
        assert_eq!(parse_list(""), Some(BTreeSet::new()));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("x"), None);
        assert_eq!(format_list(&[0, 1, 2, 3, 8, 10, 11].into()), "0-3,8,10-11");
        assert_eq!(format_list(&BTreeSet::new()), "");
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_list("0-3,8,10-11"),
            Some([0, 1, 2, 3, 8, 10, 11].into())
        );
        assert_eq!(parse_list("0\n"), Some([0].into()));
        assert_eq!(parse_list(""), Some(BTreeSet::new()));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("a"), None);
    }

    #[test]
    fn masks() {
        let table: &[(&[u32], &str)] = &[
            (&[], "0"),
            (&[0], "1"),
            (&[0, 1], "3"),
            (&[1, 3], "a"),
            (&[0, 1, 2, 3, 4, 5, 6, 7], "ff"),
            (&[31], "80000000"),
            (&[32], "1,00000000"),
            (&[0, 1, 32, 33, 34, 35, 36, 37, 38, 39], "ff,00000003"),
            (&[64], "1,00000000,00000000"),
        ];
        for (cpus, mask) in table {
            let set: BTreeSet<u32> = cpus.iter().copied().collect();
            assert_eq!(cpus_to_mask(&set), *mask, "{cpus:?}");
            assert_eq!(mask_cpus(mask), Some(set), "{mask}");
        }
        assert_eq!(mask_cpus("00000000,00000003"), Some([0, 1].into()));
        assert_eq!(mask_cpus("03"), Some([0, 1].into()));
        for bad in ["", "g", "1,,2", "123456789", "0-1"] {
            assert_eq!(mask_cpus(bad), None, "{bad:?}");
        }
    }
}
