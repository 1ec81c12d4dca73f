// SPDX-License-Identifier: Apache-2.0
//
// hoststack's built-in XDP `pass` program: passes every packet. Attaching it measures the cost
// of the XDP hook itself, and holds the interface's XDP slot without changing its traffic.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int hs_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

// Only helpers open to any license are used.
char LICENSE[] SEC("license") = "Apache-2.0";
