//! The nf_tables netlink I/O: list, replace and delete the agent's table in the calling
//! process's network namespace, and read its drop counters.
//!
//! rustables does what it can express: it builds the messages that add and delete the table
//! (with the agent's mark) and add its chains, and sends the delete batch. What it cannot
//! express is encoded here (see `expr`): sets with a size and timeout, interval-set elements
//! (rustables' elements carry no flags, so no interval ends), and rules with `dynset`, `limit`
//! or `notrack` (its raw expression cannot be built outside the crate). A replacement is one
//! batch: rustables' messages, then the agent's, then the batch end, so the kernel commits all
//! of it or none.
//!
//! Listing is the agent's own dumps, restricted to family inet: rustables' list functions ask
//! for every family (and `list_chains_for_table` matches the table by name only), its family
//! getter is private, so an `ip hoststack` table could not be told from the agent's; and it
//! cannot list set elements or decode `dynset`/`limit`/`notrack`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use rustables::{sys, Hook as ChainHook};
use rustables::{Batch, Chain, ChainPolicy, ChainType, HookClass, MsgType, ProtocolFamily, Table};

use super::attr::{self, Attr};
use super::layout::{
    layout, observe, Element, Hook, Layout, Listed, ListedChain, ListedRule, ListedSet, Observed,
    SetKind, DROP_RULES, MARK, METER_SIZE, METER_TIMEOUT_MS, TABLE,
};
use super::ruleset::Ruleset;

/// The drop counter of one rule of the agent's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DropCounter {
    /// The rule's name (its comment), one of [`DROP_RULES`].
    pub rule: String,
    /// Packets it dropped.
    pub packets: u64,
    /// Bytes it dropped.
    pub bytes: u64,
}

/// How many set elements go in one message (a netlink attribute holds at most 64 KiB).
const ELEMENTS_PER_MESSAGE: usize = 512;
/// nfnetlink's `NFNL_SUBSYS_NFTABLES`, the high byte of every nf_tables message type.
const SUBSYS: u16 = (sys::NFNL_SUBSYS_NFTABLES as u16) << 8;
/// Size of `struct nlmsghdr`.
const NLMSG_HEADER: usize = 16;
/// Size of `struct nfgenmsg`, the nfnetlink header after it.
const NFGENMSG: usize = 4;
/// Receive buffer: netlink datagrams from nf_tables (dump parts, acknowledgements) are at most
/// 32 KiB.
const RECEIVE_BUFFER: usize = 64 * 1024;
/// The comment tag of nftables' table and rule userdata (`NFTNL_UDATA_*_COMMENT`).
const UDATA_COMMENT: u8 = 0;

/// Lists what the kernel has under the agent's table name.
pub fn read() -> io::Result<Observed> {
    match find_table()? {
        None => Ok(Observed::Absent),
        Some(Some(c)) if c == MARK => Ok(observe(&list()?)),
        Some(comment) => Ok(Observed::Foreign(foreign(comment))),
    }
}

/// What a table the agent did not make carries instead of the mark.
fn foreign(comment: Option<String>) -> String {
    match comment {
        Some(c) => format!("comment {c:?}"),
        None => "no comment".into(),
    }
}

/// Replaces the agent's table with one implementing `ruleset`, in one batch; refuses when a
/// table of that name exists that the agent did not make.
pub fn replace(ruleset: &Ruleset) -> io::Result<()> {
    refuse_foreign()?;
    let layout = layout(ruleset);
    let (mut batch, mut what, mut seq) = table_and_chains(&layout)?;
    let mut push = |name: String, msg_type: u32, flags: u16, attrs: Vec<Attr>| {
        batch.extend(message(msg_type, flags, seq, &attrs));
        what.push((seq, name));
        seq += 1;
    };
    let create = sys::NLM_F_CREATE as u16;
    for (id, set) in layout.sets.iter().enumerate() {
        let mut attrs = vec![
            Attr::Str(sys::NFTA_SET_TABLE, TABLE.into()),
            Attr::Str(sys::NFTA_SET_NAME, set.name.into()),
            Attr::U32(sys::NFTA_SET_FLAGS, set.flags()),
            Attr::U32(sys::NFTA_SET_KEY_TYPE, set.key_type),
            Attr::U32(sys::NFTA_SET_KEY_LEN, set.key_len),
            Attr::U32(sys::NFTA_SET_ID, id as u32 + 1),
        ];
        if set.kind == SetKind::Meter {
            attrs.push(Attr::U64(sys::NFTA_SET_TIMEOUT, METER_TIMEOUT_MS));
            attrs.push(Attr::Nested(
                sys::NFTA_SET_DESC,
                vec![Attr::U32(sys::NFTA_SET_DESC_SIZE, METER_SIZE)],
            ));
        }
        push(
            format!("add set {}", set.name),
            sys::NFT_MSG_NEWSET,
            create,
            attrs,
        );
        for chunk in set.elements.chunks(ELEMENTS_PER_MESSAGE) {
            let elements = chunk.iter().map(element).collect();
            let attrs = vec![
                Attr::Str(sys::NFTA_SET_ELEM_LIST_TABLE, TABLE.into()),
                Attr::Str(sys::NFTA_SET_ELEM_LIST_SET, set.name.into()),
                Attr::Nested(sys::NFTA_SET_ELEM_LIST_ELEMENTS, elements),
            ];
            push(
                format!("add elements to set {}", set.name),
                sys::NFT_MSG_NEWSETELEM,
                create,
                attrs,
            );
        }
    }
    for rule in &layout.rules {
        let attrs = vec![
            Attr::Str(sys::NFTA_RULE_TABLE, TABLE.into()),
            Attr::Str(sys::NFTA_RULE_CHAIN, rule.chain.into()),
            Attr::Nested(
                sys::NFTA_RULE_EXPRESSIONS,
                rule.exprs.iter().map(|e| e.list_elem()).collect(),
            ),
            Attr::Bytes(sys::NFTA_RULE_USERDATA, userdata_comment(rule.comment)),
        ];
        push(
            format!("add rule {}", rule.comment),
            sys::NFT_MSG_NEWRULE,
            create | sys::NLM_F_APPEND as u16,
            attrs,
        );
    }
    batch.extend(batch_end(seq));
    send_batch(&batch, &what)
}

/// Deletes the agent's table (nothing when there is none); refuses a table of that name that
/// the agent did not make.
pub fn delete() -> io::Result<()> {
    refuse_foreign()?;
    // Adding an existing table changes nothing, so the delete never fails for want of one.
    let mut batch = Batch::new();
    batch.add(&table(), MsgType::Add);
    batch.add(&table(), MsgType::Del);
    batch.send().map_err(query_error)
}

/// The drop counters of the agent's table; none when it does not exist or is not the agent's.
pub fn drop_counters() -> io::Result<Vec<DropCounter>> {
    if find_table()?.flatten().as_deref() != Some(MARK) {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for rule in list_rules()? {
        let Some(name) = rule.comment.filter(|c| DROP_RULES.contains(&c.as_str())) else {
            continue;
        };
        let counter = rule
            .exprs
            .iter()
            .find(|(n, _)| n == "counter")
            .and_then(|(_, data)| attr::parse(data));
        if let Some(c) = counter {
            let total = |k| attr::find(&c, k).and_then(attr::be64).unwrap_or(0);
            out.push(DropCounter {
                rule: name,
                packets: total(sys::NFTA_COUNTER_PACKETS),
                bytes: total(sys::NFTA_COUNTER_BYTES),
            });
        }
    }
    Ok(out)
}

/// Whether the table `inet hoststack` exists, and its comment if it has one.
fn find_table() -> io::Result<Option<Option<String>>> {
    for msg in dump(sys::NFT_MSG_GETTABLE, &[])? {
        let a = attr::parse(&msg).ok_or_else(|| malformed("table"))?;
        if attr::find(&a, sys::NFTA_TABLE_NAME)
            .and_then(attr::string)
            .as_deref()
            == Some(TABLE)
        {
            return Ok(Some(
                attr::find(&a, sys::NFTA_TABLE_USERDATA).and_then(comment),
            ));
        }
    }
    Ok(None)
}

/// An error when a table of the agent's name exists that the agent did not make.
fn refuse_foreign() -> io::Result<()> {
    match find_table()? {
        None => Ok(()),
        Some(Some(c)) if c == MARK => Ok(()),
        Some(comment) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "table inet {TABLE} exists but hoststack did not make it ({}); refusing to \
                 change it",
                foreign(comment)
            ),
        )),
    }
}

/// The agent's table as a rustables object (name and family only).
fn table() -> Table {
    Table::new(ProtocolFamily::Inet).with_name(TABLE)
}

/// The rules of the agent's table, in order.
fn list_rules() -> io::Result<Vec<ListedRule>> {
    let mut rules = Vec::new();
    for msg in ours(sys::NFT_MSG_GETRULE, sys::NFTA_RULE_TABLE, "rule")? {
        rules.push(rule_of(&msg).ok_or_else(|| malformed("rule"))?);
    }
    Ok(rules)
}

/// The objects of one kind (`NFT_MSG_GET*`) in the agent's table: the dump asks for that table
/// only, and whatever else it returns (the kernel does not filter every kind) is dropped.
fn ours(msg_type: u32, table_attr: u16, what: &str) -> io::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for msg in dump(msg_type, &[Attr::Str(table_attr, TABLE.into())])? {
        let a = attr::parse(&msg).ok_or_else(|| malformed(what))?;
        if attr::find(&a, table_attr).and_then(attr::string).as_deref() == Some(TABLE) {
            out.push(msg);
        }
    }
    Ok(out)
}

/// Everything in the agent's table.
fn list() -> io::Result<Listed> {
    let mut chains = Vec::new();
    for msg in ours(sys::NFT_MSG_GETCHAIN, sys::NFTA_CHAIN_TABLE, "chain")? {
        let a = attr::parse(&msg).ok_or_else(|| malformed("chain"))?;
        let hook = attr::find(&a, sys::NFTA_CHAIN_HOOK).and_then(attr::parse);
        let hook_u32 = |k| {
            hook.as_ref()
                .and_then(|h| attr::find(h, k))
                .and_then(attr::be32)
        };
        chains.push(ListedChain {
            name: attr::find(&a, sys::NFTA_CHAIN_NAME)
                .and_then(attr::string)
                .unwrap_or_default(),
            hook: hook_u32(sys::NFTA_HOOK_HOOKNUM),
            priority: hook_u32(sys::NFTA_HOOK_PRIORITY).map(|p| p as i32),
        });
    }
    let mut sets = Vec::new();
    for msg in ours(sys::NFT_MSG_GETSET, sys::NFTA_SET_TABLE, "set")? {
        let a = attr::parse(&msg).ok_or_else(|| malformed("set"))?;
        let u32_of = |k| attr::find(&a, k).and_then(attr::be32).unwrap_or(0);
        sets.push(ListedSet {
            name: attr::find(&a, sys::NFTA_SET_NAME)
                .and_then(attr::string)
                .unwrap_or_default(),
            flags: u32_of(sys::NFTA_SET_FLAGS),
            key_type: u32_of(sys::NFTA_SET_KEY_TYPE),
            key_len: u32_of(sys::NFTA_SET_KEY_LEN),
        });
    }
    let mut elements = std::collections::BTreeMap::new();
    for set in &sets {
        if set.flags & sys::NFT_SET_EVAL != 0 {
            continue;
        }
        let request = vec![
            Attr::Str(sys::NFTA_SET_ELEM_LIST_TABLE, TABLE.into()),
            Attr::Str(sys::NFTA_SET_ELEM_LIST_SET, set.name.clone()),
        ];
        let mut found = Vec::new();
        for msg in dump(sys::NFT_MSG_GETSETELEM, &request)? {
            found.extend(elements_of(&msg).ok_or_else(|| malformed("set element"))?);
        }
        elements.insert(set.name.clone(), found);
    }
    Ok(Listed {
        chains,
        sets,
        elements,
        rules: list_rules()?,
    })
}

/// The elements of one `NEWSETELEM` dump message.
fn elements_of(msg: &[u8]) -> Option<Vec<Element>> {
    let a = attr::parse(msg)?;
    let Some(list) = attr::find(&a, sys::NFTA_SET_ELEM_LIST_ELEMENTS) else {
        return Some(Vec::new());
    };
    attr::parse(list)?
        .into_iter()
        .map(|(_, elem)| {
            let e = attr::parse(elem)?;
            let key = attr::parse(attr::find(&e, sys::NFTA_SET_ELEM_KEY)?)?;
            let flags = attr::find(&e, sys::NFTA_SET_ELEM_FLAGS)
                .and_then(attr::be32)
                .unwrap_or(0);
            Some(Element {
                key: attr::find(&key, sys::NFTA_DATA_VALUE)?.to_vec(),
                interval_end: flags & sys::NFT_SET_ELEM_INTERVAL_END != 0,
            })
        })
        .collect()
}

/// One `NEWRULE` dump message.
fn rule_of(msg: &[u8]) -> Option<ListedRule> {
    let a = attr::parse(msg)?;
    let exprs = match attr::find(&a, sys::NFTA_RULE_EXPRESSIONS) {
        None => Vec::new(),
        Some(list) => attr::parse(list)?
            .into_iter()
            .map(|(_, e)| {
                let e = attr::parse(e)?;
                let name = attr::string(attr::find(&e, sys::NFTA_EXPR_NAME)?)?;
                let data = attr::find(&e, sys::NFTA_EXPR_DATA).unwrap_or_default();
                Some((name, data.to_vec()))
            })
            .collect::<Option<_>>()?,
    };
    Some(ListedRule {
        chain: attr::string(attr::find(&a, sys::NFTA_RULE_CHAIN)?)?,
        comment: attr::find(&a, sys::NFTA_RULE_USERDATA).and_then(comment),
        exprs,
    })
}

fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the kernel listed a {what} that does not parse"),
    )
}

/// The comment in nftables userdata (type-length-value entries of one byte each).
fn comment(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while let [kind, len, tail @ ..] = rest {
        let value = tail.get(..usize::from(*len))?;
        if *kind == UDATA_COMMENT {
            return attr::string(value);
        }
        rest = &tail[usize::from(*len)..];
    }
    None
}

/// nftables userdata holding `text` as the comment.
fn userdata_comment(text: &str) -> Vec<u8> {
    let mut out = vec![UDATA_COMMENT, (text.len() + 1) as u8];
    out.extend_from_slice(text.as_bytes());
    out.push(0);
    out
}

/// One set element: its key, and the interval-end flag where it has it.
fn element(e: &Element) -> Attr {
    let mut attrs = vec![Attr::Nested(
        sys::NFTA_SET_ELEM_KEY,
        vec![Attr::Bytes(sys::NFTA_DATA_VALUE, e.key.clone())],
    )];
    if e.interval_end {
        attrs.push(Attr::U32(
            sys::NFTA_SET_ELEM_FLAGS,
            sys::NFT_SET_ELEM_INTERVAL_END,
        ));
    }
    Attr::Nested(sys::NFTA_LIST_ELEM, attrs)
}

/// The start of the replacement batch, built by rustables: add the table (a no-op when it
/// exists), delete it, add it anew with the agent's mark, add its chains. Returns the bytes
/// without rustables' batch end, what each message does by sequence number, and the next
/// sequence number.
#[allow(clippy::type_complexity)]
fn table_and_chains(layout: &Layout) -> io::Result<(Vec<u8>, Vec<(u32, String)>, u32)> {
    let marked = table().with_userdata(userdata_comment(MARK));
    let mut what = vec![
        (1, format!("add table inet {TABLE}")),
        (2, format!("delete table inet {TABLE}")),
        (3, format!("add table inet {TABLE}")),
    ];
    let mut batch = Batch::new();
    batch.add(&table(), MsgType::Add);
    batch.add(&table(), MsgType::Del);
    batch.add(&marked, MsgType::Add);
    for (i, c) in layout.chains.iter().enumerate() {
        let class = match c.hook {
            Hook::Prerouting => HookClass::PreRouting,
            Hook::Output => HookClass::Out,
        };
        let chain = Chain::new(&marked)
            .with_name(c.name)
            .with_hook(ChainHook::new(class, c.priority))
            .with_type(ChainType::Filter)
            .with_policy(ChainPolicy::Accept);
        batch.add(&chain, MsgType::Add);
        what.push((4 + i as u32, format!("add chain {}", c.name)));
    }
    let next = 4 + layout.chains.len() as u32;
    let mut bytes = batch.finalize();
    // Drop rustables' batch end: the agent's messages go before the end.
    let end = last_message_start(&bytes)
        .ok_or_else(|| io::Error::other("rustables built a batch that does not parse"))?;
    bytes.truncate(end);
    Ok((bytes, what, next))
}

/// Where the last netlink message of `bytes` starts.
fn last_message_start(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    let mut last = None;
    while at + NLMSG_HEADER <= bytes.len() {
        let len = u32::from_ne_bytes(bytes[at..at + 4].try_into().ok()?) as usize;
        if len < NLMSG_HEADER {
            return None;
        }
        last = Some(at);
        at += attr::align(len);
    }
    last
}

/// An nf_tables request: header, `nfgenmsg` for family inet, attributes.
fn message(msg_type: u32, flags: u16, seq: u32, attrs: &[Attr]) -> Vec<u8> {
    let body = attr::encode_all(attrs);
    let len = (NLMSG_HEADER + NFGENMSG + body.len()) as u32;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&(SUBSYS | msg_type as u16).to_ne_bytes());
    let flags = flags | sys::NLM_F_REQUEST as u16 | sys::NLM_F_ACK as u16;
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
    out.extend_from_slice(&[libc::NFPROTO_INET as u8, sys::NFNETLINK_V0 as u8, 0, 0]);
    out.extend_from_slice(&body);
    out
}

/// The batch end message.
fn batch_end(seq: u32) -> Vec<u8> {
    let len = (NLMSG_HEADER + NFGENMSG) as u32;
    let mut out = Vec::new();
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&(sys::NFNL_MSG_BATCH_END as u16).to_ne_bytes());
    out.extend_from_slice(&(sys::NLM_F_REQUEST as u16).to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    let res_id = (sys::NFNL_SUBSYS_NFTABLES as u16).to_be_bytes();
    out.extend_from_slice(&[0, sys::NFNETLINK_V0 as u8, res_id[0], res_id[1]]);
    out
}

/// A netlink socket to nf_tables.
fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned by the OwnedFd from here on.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn send_all(fd: &OwnedFd, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: the buffer outlives the call; its length is passed with it.
    let sent = unsafe { libc::send(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != bytes.len() {
        return Err(io::Error::other("netlink sent only part of the message"));
    }
    Ok(())
}

/// Receives one datagram; `None` when `nonblocking` and nothing is queued.
/// A datagram longer than the buffer is an error (`MSG_TRUNC` makes recv report its real
/// length), never a silently cut message.
fn receive(fd: &OwnedFd, buf: &mut [u8], nonblocking: bool) -> io::Result<Option<usize>> {
    let flags = libc::MSG_TRUNC | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    // SAFETY: the buffer outlives the call; its length is passed with it.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if nonblocking && e.kind() == io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(e);
    }
    let n = n as usize;
    if n > buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a netlink datagram of {n} bytes does not fit in {}",
                buf.len()
            ),
        ));
    }
    Ok(Some(n))
}

/// The netlink messages in a datagram: type, sequence number, payload after the header.
fn messages(buf: &[u8]) -> Vec<(u16, u32, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + NLMSG_HEADER <= buf.len() {
        let word = |o: usize| u32::from_ne_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
        let len = word(at) as usize;
        if len < NLMSG_HEADER || at + len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
        out.push((kind, word(at + 8), &buf[at + NLMSG_HEADER..at + len]));
        at += attr::align(len);
    }
    out
}

/// The error code of an `NLMSG_ERROR` payload (0 is an acknowledgement).
fn error_code(payload: &[u8]) -> i32 {
    payload
        .get(..4)
        .map_or(-libc::EIO, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// Sends a batch and checks the kernel's answer to every message. The kernel handles a batch
/// within the send, so every answer is queued when it returns.
fn send_batch(batch: &[u8], what: &[(u32, String)]) -> io::Result<()> {
    let fd = socket()?;
    let size = i32::try_from(batch.len() * 2).unwrap_or(i32::MAX);
    // A large table needs a larger send buffer than the default; without privilege to force
    // it, the send itself reports the problem.
    // SAFETY: setsockopt with a pointer to an int and its size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            (&size as *const i32).cast(),
            std::mem::size_of::<i32>() as u32,
        );
    }
    send_all(&fd, batch)?;
    let last = what.last().map(|(seq, _)| *seq);
    let mut last_acked = false;
    let mut buf = vec![0u8; RECEIVE_BUFFER];
    let mut first_error: Option<io::Error> = None;
    while let Some(n) = receive(&fd, &mut buf, true)? {
        for (kind, seq, payload) in messages(&buf[..n]) {
            if u32::from(kind) != sys::NLMSG_ERROR {
                continue;
            }
            let code = error_code(payload);
            if code == 0 {
                last_acked |= Some(seq) == last;
            } else if first_error.is_none() {
                let doing = what
                    .iter()
                    .find(|(s, _)| *s == seq)
                    .map_or("the batch", |(_, w)| w.as_str());
                let e = io::Error::from_raw_os_error(-code);
                first_error = Some(io::Error::new(e.kind(), format!("{doing}: {e}")));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        // Every message asks for an acknowledgement: without the last one the batch's fate is
        // unknown (the read-back decides).
        None if !last_acked => Err(io::Error::other(
            "the kernel did not acknowledge the whole batch",
        )),
        None => Ok(()),
    }
}

/// Dumps objects of `msg_type` (`NFT_MSG_GET*`) of family inet, filtered by `attrs`; the
/// attribute payload of every object.
fn dump(msg_type: u32, attrs: &[Attr]) -> io::Result<Vec<Vec<u8>>> {
    let fd = socket()?;
    let mut request = message(msg_type, sys::NLM_F_DUMP as u16, 1, attrs);
    // A dump request is acknowledged by its end, not by an ack.
    let flags = sys::NLM_F_REQUEST as u16 | sys::NLM_F_DUMP as u16;
    request[6..8].copy_from_slice(&flags.to_ne_bytes());
    send_all(&fd, &request)?;
    let mut buf = vec![0u8; RECEIVE_BUFFER];
    let mut out = Vec::new();
    loop {
        let n = receive(&fd, &mut buf, false)?.unwrap_or(0);
        if n == 0 {
            return Err(io::Error::other("netlink closed during a dump"));
        }
        for (kind, _, payload) in messages(&buf[..n]) {
            match u32::from(kind) {
                sys::NLMSG_DONE => return Ok(out),
                sys::NLMSG_ERROR => {
                    let code = error_code(payload);
                    if code != 0 {
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                }
                _ => out.push(payload.get(NFGENMSG..).unwrap_or_default().to_vec()),
            }
        }
    }
}

/// A rustables error as an I/O error, keeping the kernel's errno where there is one.
fn query_error(e: rustables::error::QueryError) -> io::Error {
    use rustables::error::QueryError;
    if let QueryError::NetlinkError(err) = &e {
        return io::Error::from_raw_os_error(-err.error);
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    io::Error::other(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userdata_comments_round_trip_and_skip_other_tags() {
        let u = userdata_comment("blocked-ipv4");
        assert_eq!(u[..2], [0, 13]);
        assert_eq!(comment(&u).as_deref(), Some("blocked-ipv4"));
        let mut other_first = vec![3, 2, 0xaa, 0xbb];
        other_first.extend(&u);
        assert_eq!(comment(&other_first).as_deref(), Some("blocked-ipv4"));
        assert_eq!(comment(&[0, 9, b'x']), None, "truncated");
    }

    #[test]
    fn messages_carry_the_nftables_subsystem_family_and_ack() {
        let m = message(sys::NFT_MSG_NEWRULE, 0, 7, &[Attr::U32(1, 2)]);
        assert_eq!(m.len(), 28);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 28);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), (10 << 8) | 6);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), 1 | 4, "request and ack");
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        assert_eq!(m[16], 1, "NFPROTO_INET");
        let parsed = messages(&m);
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].1, 7);
        assert_eq!(parsed[0].2.len(), 12);
    }

    #[test]
    fn rustables_batches_lose_their_end_before_the_agents_messages() {
        let layout = layout(&Ruleset::default());
        let (bytes, what, next) = table_and_chains(&layout).expect("builds");
        let parsed = messages(&bytes);
        let kinds: Vec<u16> = parsed.iter().map(|m| m.0).collect();
        assert_eq!(
            kinds,
            [
                sys::NFNL_MSG_BATCH_BEGIN as u16,
                SUBSYS | sys::NFT_MSG_NEWTABLE as u16,
                SUBSYS | sys::NFT_MSG_DELTABLE as u16,
                SUBSYS | sys::NFT_MSG_NEWTABLE as u16,
                SUBSYS | sys::NFT_MSG_NEWCHAIN as u16,
            ]
        );
        let seqs: Vec<u32> = parsed.iter().map(|m| m.1).collect();
        assert_eq!(seqs, [0, 1, 2, 3, 4]);
        assert_eq!(next, 5);
        assert_eq!(
            what.last().map(|w| w.1.as_str()),
            Some("add chain prerouting")
        );
    }
}
