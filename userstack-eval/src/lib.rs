//! The evaluation of userstack, the user-space TCP stack: the same [`rows`] run in the
//! simulator ([`sim`]) and on a real netem link between network namespaces beside Linux's
//! TCP ([`link`]), measured as [`report::Measurement`]s and written to docs/evaluation.md
//! ([`docs`]). The command is `userstack-eval` (src/bin); `hoststack-lab evaluate` runs its
//! `link` part in the VM node's guest, whose kernel has netem.

#![warn(missing_docs)]

pub mod docs;
pub mod link;
pub mod report;
pub mod rows;
pub mod sim;
pub mod spread;
