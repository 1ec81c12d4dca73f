/*
 * hoststack userstack: the DPDK calls the Rust device makes, as bindgen sees them. DPDK's
 * burst, mbuf and errno functions are `static inline` (no symbol to link against), so shim.c
 * wraps each in a real function named hs_*; the rest of the API comes straight from the
 * headers included here.
 */
#ifndef HOSTSTACK_DPDK_SHIM_H
#define HOSTSTACK_DPDK_SHIM_H

#include <stdint.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

/* rte_eth_rx_burst: up to n received mbufs of (port, queue) into mbufs; how many. */
uint16_t hs_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **mbufs, uint16_t n);

/* rte_eth_tx_burst: hands up to n mbufs to (port, queue); how many it took (the caller
 * still owns the rest). */
uint16_t hs_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **mbufs, uint16_t n);

/* Copies the packet in m (all segments) into dst, at most cap bytes; the packet's length,
 * or -1 when it does not fit. Does not free m. */
int32_t hs_mbuf_copy_out(const struct rte_mbuf *m, uint8_t *dst, uint32_t cap);

/* An mbuf from pool holding a copy of len bytes at src; NULL when the pool is empty or the
 * frame does not fit one mbuf. */
struct rte_mbuf *hs_mbuf_from(struct rte_mempool *pool, const uint8_t *src, uint32_t len);

/* rte_pktmbuf_free. */
void hs_mbuf_free(struct rte_mbuf *m);

/* The calling thread's rte_errno. */
int hs_errno(void);

/* RTE_MBUF_DEFAULT_BUF_SIZE: the data room of each mbuf in the pool. */
uint16_t hs_default_buf_size(void);

/* RTE_ETH_RSS_IPV4 | RTE_ETH_RSS_NONFRAG_IPV4_TCP (macros bindgen cannot evaluate). */
uint64_t hs_rss_ipv4_tcp(void);

/* RTE_ETH_RX_OFFLOAD_TCP_CKSUM and RTE_ETH_TX_OFFLOAD_TCP_CKSUM (RTE_BIT64 macros). */
uint64_t hs_rx_offload_tcp_cksum(void);
uint64_t hs_tx_offload_tcp_cksum(void);

/* What the PMD says about a received mbuf's L4 checksum (ol_flags &
 * RTE_MBUF_F_RX_L4_CKSUM_MASK): 1 when GOOD or NONE (valid data whose checksum is not filled
 * in, virtio's NEEDS_CSUM), -1 when BAD, 0 when UNKNOWN. */
int hs_mbuf_rx_l4_cksum(const struct rte_mbuf *m);

/* Asks the PMD to complete the TCP checksum of the IPv4 packet in m, whose checksum field
 * holds the pseudo-header sum: RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_TCP_CKSUM, with the
 * Ethernet and IP header lengths. */
void hs_mbuf_tx_tcp_cksum(struct rte_mbuf *m, uint16_t l2_len, uint16_t l3_len);

#endif
