// SPDX-License-Identifier: Apache-2.0
//
// hoststack's built-in XDP `blocklist` program: drops every packet whose source address lies in
// a blocked prefix and counts the drops per CPU; passes everything else.
//
// The prefixes live in two LPM-trie maps, one per address family, whose keys are the prefix
// length followed by the address in network byte order (the layout the kernel's LPM trie
// expects). The agent pins the maps and fills them from user space, so the list changes without
// the program being detached. `drops` is a per-CPU array: index 0 counts dropped packets,
// index 1 their bytes; the agent's exporter sums it over CPUs.
//
// No CO-RE: the program reads only packet bytes through fixed UAPI header layouts, so it loads on
// kernels without BTF for vmlinux.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_PREFIXES 4096

struct prefix_v4 {
	__u32 prefixlen;
	__u8 addr[4];
};

struct prefix_v6 {
	__u32 prefixlen;
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct prefix_v4);
	__type(value, __u8);
	__uint(max_entries, MAX_PREFIXES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} blocklist_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct prefix_v6);
	__type(value, __u8);
	__uint(max_entries, MAX_PREFIXES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} blocklist_v6 SEC(".maps");

enum { DROPPED_PACKETS = 0, DROPPED_BYTES = 1 };

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 2);
} drops SEC(".maps");

struct vlan_tag {
	__be16 tci;
	__be16 proto;
};

static __always_inline int drop(struct xdp_md *ctx)
{
	__u32 packets = DROPPED_PACKETS, bytes = DROPPED_BYTES;
	__u64 *count = bpf_map_lookup_elem(&drops, &packets);
	if (count)
		*count += 1;
	count = bpf_map_lookup_elem(&drops, &bytes);
	if (count)
		*count += ctx->data_end - ctx->data;
	return XDP_DROP;
}

SEC("xdp")
int hs_blocklist(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	void *next = eth + 1;
	if (next > data_end)
		return XDP_PASS;
	__be16 proto = eth->h_proto;
	// Up to two VLAN tags (802.1Q, 802.1ad).
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		struct vlan_tag *tag = next;
		if ((void *)(tag + 1) > data_end)
			return XDP_PASS;
		proto = tag->proto;
		next = tag + 1;
	}
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = next;
		if ((void *)(ip + 1) > data_end)
			return XDP_PASS;
		struct prefix_v4 key = { .prefixlen = 32 };
		__builtin_memcpy(key.addr, &ip->saddr, sizeof(key.addr));
		if (bpf_map_lookup_elem(&blocklist_v4, &key))
			return drop(ctx);
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = next;
		if ((void *)(ip6 + 1) > data_end)
			return XDP_PASS;
		struct prefix_v6 key = { .prefixlen = 128 };
		__builtin_memcpy(key.addr, &ip6->saddr, sizeof(key.addr));
		if (bpf_map_lookup_elem(&blocklist_v6, &key))
			return drop(ctx);
	}
	return XDP_PASS;
}

// Only helpers open to any license are used.
char LICENSE[] SEC("license") = "Apache-2.0";
