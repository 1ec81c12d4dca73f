//! The nftables port: the agent's own table, `inet hoststack`, listed, replaced and deleted
//! over nf_tables netlink in the agent's network namespace.
//!
//! The agent only touches a table it made: the table carries the comment [`layout::MARK`].
//! A table of that name without it lists as [`Observed::Foreign`], and replacing or deleting
//! it is refused.
//!
//! - [`ruleset`]: the pure ruleset (spec → canonical description and back);
//! - [`layout`]: the pure nftables objects of a ruleset, and the way back from a listing;
//! - [`expr`], [`attr`]: the expressions and their netlink attributes;
//! - [`netlink`]: the kernel I/O (rustables where it can, the agent's encoding where not).

use std::fmt;
use std::io;

use super::RealKernel;
pub use layout::Observed;
pub use ruleset::Ruleset;

pub mod attr;
pub mod expr;
pub mod layout;
pub mod netlink;
pub mod ruleset;

/// The calls of the nftables applier on the agent's table.
pub trait Nftables: fmt::Debug + Send + Sync {
    /// Lists the agent's table (`inet hoststack`) in the agent's network namespace.
    fn read_table(&self) -> io::Result<Observed>;
    /// Replaces the agent's table with one implementing `ruleset`, in one batch.
    fn replace_table(&self, ruleset: &Ruleset) -> io::Result<()>;
    /// Deletes the agent's table; nothing when there is none.
    fn delete_table(&self) -> io::Result<()>;
}

impl Nftables for RealKernel {
    fn read_table(&self) -> io::Result<Observed> {
        netlink::read()
    }

    fn replace_table(&self, ruleset: &Ruleset) -> io::Result<()> {
        netlink::replace(ruleset)
    }

    fn delete_table(&self) -> io::Result<()> {
        netlink::delete()
    }
}
