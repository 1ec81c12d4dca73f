/*
 * hoststack userstack: real functions around DPDK's static inline ones (see shim.h), compiled
 * by build.rs only with the cargo feature `dpdk`, with the flags of `pkg-config --cflags
 * libdpdk`.
 */
#include <string.h>
#include "shim.h"

uint16_t hs_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **mbufs, uint16_t n)
{
	return rte_eth_rx_burst(port, queue, mbufs, n);
}

uint16_t hs_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **mbufs, uint16_t n)
{
	return rte_eth_tx_burst(port, queue, mbufs, n);
}

int32_t hs_mbuf_copy_out(const struct rte_mbuf *m, uint8_t *dst, uint32_t cap)
{
	uint32_t len = rte_pktmbuf_pkt_len(m);
	const void *data;

	if (len > cap)
		return -1;
	/* Returns a pointer into the mbuf when the packet is contiguous, else copies into dst. */
	data = rte_pktmbuf_read(m, 0, len, dst);
	if (data == NULL)
		return -1;
	if (data != dst)
		memcpy(dst, data, len);
	return (int32_t)len;
}

struct rte_mbuf *hs_mbuf_from(struct rte_mempool *pool, const uint8_t *src, uint32_t len)
{
	struct rte_mbuf *m;
	char *room;

	if (len > UINT16_MAX)
		return NULL;
	m = rte_pktmbuf_alloc(pool);
	if (m == NULL)
		return NULL;
	room = rte_pktmbuf_append(m, (uint16_t)len);
	if (room == NULL) {
		rte_pktmbuf_free(m);
		return NULL;
	}
	rte_memcpy(room, src, len);
	return m;
}

void hs_mbuf_free(struct rte_mbuf *m)
{
	rte_pktmbuf_free(m);
}

int hs_errno(void)
{
	return rte_errno;
}

uint16_t hs_default_buf_size(void)
{
	return RTE_MBUF_DEFAULT_BUF_SIZE;
}

uint64_t hs_rss_ipv4_tcp(void)
{
	return RTE_ETH_RSS_IPV4 | RTE_ETH_RSS_NONFRAG_IPV4_TCP;
}

uint64_t hs_rx_offload_tcp_cksum(void)
{
	return RTE_ETH_RX_OFFLOAD_TCP_CKSUM;
}

uint64_t hs_tx_offload_tcp_cksum(void)
{
	return RTE_ETH_TX_OFFLOAD_TCP_CKSUM;
}

int hs_mbuf_rx_l4_cksum(const struct rte_mbuf *m)
{
	switch (m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK) {
	case RTE_MBUF_F_RX_L4_CKSUM_GOOD:
	case RTE_MBUF_F_RX_L4_CKSUM_NONE:
		return 1;
	case RTE_MBUF_F_RX_L4_CKSUM_BAD:
		return -1;
	default:
		return 0;
	}
}

void hs_mbuf_tx_tcp_cksum(struct rte_mbuf *m, uint16_t l2_len, uint16_t l3_len)
{
	m->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_TCP_CKSUM;
	m->l2_len = l2_len;
	m->l3_len = l3_len;
}
