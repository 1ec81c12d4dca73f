// SPDX-License-Identifier: Apache-2.0
//
// The userstack's AF_XDP redirect program. Frames for the user-space stack go to the AF_XDP
// socket of the queue they arrived on (through the `xsks` XSKMAP); everything else passes to
// the kernel, so management traffic on the same NIC is untouched. The stack's frames are:
//   - ARP whose target protocol address is the stack's address;
//   - IPv4 TCP to the stack's address whose destination port is a service port (`ports`) or
//     lies in the stack's ephemeral range (replies to connections the stack opened);
//   - IPv4 ICMP to the stack's address (echo requests, which the stack answers as a host
//     does; the kernel does not own the address and would drop them).
// `settings` holds [address (network order), first ephemeral port, last ephemeral port].
// A queue without a socket falls back to XDP_PASS (bpf_redirect_map's default action).
// Each redirected frame carries 16 bytes of XDP metadata just before it: the kernel's
// monotonic clock in nanoseconds when the program ran, then that value XOR RX_STAMP_CHECK,
// so the runner can tell how long the frame waited before it took it off the ring (and can
// tell a stamp from stale bytes where a driver keeps no metadata). Compiled with
// -DNO_RX_STAMPS, the program stamps nothing and calls no bpf_xdp_adjust_meta: the build the
// runner loads where the kernel refuses that helper to XDP programs (build.rs builds both).
// Only packet bytes are read: no CO-RE, so it loads on kernels without vmlinux BTF.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define SETTING_ADDRESS 0
#define SETTING_EPHEMERAL_FIRST 1
#define SETTING_EPHEMERAL_LAST 2

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u16);
	__type(value, __u8);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__type(value, __u32);
} settings SEC(".maps");

// Must match RX_STAMP_CHECK in src/device/rx_stamp.rs.
#define RX_STAMP_CHECK 0x7573746b72787374ULL

// ARP for IPv4 over Ethernet: the target protocol address sits 24 bytes into the ARP payload.
#define ARP_TPA_OFFSET 24
#define ARP_LEN 28

static __always_inline __u32 setting(__u32 index)
{
	__u32 *value = bpf_map_lookup_elem(&settings, &index);
	return value ? *value : 0;
}

static __always_inline int is_stack_port(__u16 port)
{
	if (bpf_map_lookup_elem(&ports, &port))
		return 1;
	return port >= setting(SETTING_EPHEMERAL_FIRST) && port <= setting(SETTING_EPHEMERAL_LAST);
}

// Stamps the frame (where the driver has room for metadata) and redirects it.
static __always_inline int redirect(struct xdp_md *ctx)
{
#ifndef NO_RX_STAMPS
	if (bpf_xdp_adjust_meta(ctx, -2 * (int)sizeof(__u64)) == 0) {
		__u64 *meta = (void *)(long)ctx->data_meta;
		if ((void *)(meta + 2) <= (void *)(long)ctx->data) {
			__u64 now = bpf_ktime_get_ns();
			meta[0] = now;
			meta[1] = now ^ RX_STAMP_CHECK;
		}
	}
#endif
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
}

SEC("xdp")
int userstack_redirect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u32 address;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	address = setting(SETTING_ADDRESS);
	if (address == 0)
		return XDP_PASS;

	if (eth->h_proto == bpf_htons(ETH_P_ARP)) {
		__u8 *arp = (void *)(eth + 1);
		__u32 target;

		if ((void *)(arp + ARP_LEN) > data_end)
			return XDP_PASS;
		__builtin_memcpy(&target, arp + ARP_TPA_OFFSET, sizeof(target));
		if (target != address)
			return XDP_PASS;
		return redirect(ctx);
	}

	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		return XDP_PASS;
	if (ip->daddr != address || ip->ihl < 5)
		return XDP_PASS;
	if (ip->protocol == IPPROTO_ICMP)
		return redirect(ctx);
	if (ip->protocol != IPPROTO_TCP)
		return XDP_PASS;
	struct tcphdr *tcp = (void *)ip + ip->ihl * 4;
	if ((void *)(tcp + 1) > data_end)
		return XDP_PASS;
	if (!is_stack_port(bpf_ntohs(tcp->dest)))
		return XDP_PASS;
	return redirect(ctx);
}

// Only helpers open to any license are used.
char LICENSE[] SEC("license") = "Apache-2.0";
