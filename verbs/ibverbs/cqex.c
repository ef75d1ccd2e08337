/*
 * The extended CQ (ibv_create_cq_ex; man ibv_create_cq_ex): completions
 * read one at a time by ibv_start_poll, ibv_next_poll and ibv_end_poll,
 * their fields by the ibv_wc_read_* calls, from the same ring as
 * ibv_poll_cq's. The CQ's lock is held from a start_poll that found a
 * completion to end_poll, as the man page's polling region is; a
 * start_poll that finds none (ENOENT) releases it, and yields the
 * processor as an empty ibv_poll_cq does.
 *
 * The fields of ibv_poll_cq's ibv_wc can be asked for (IBV_WC_STANDARD_FLAGS);
 * completion timestamps, VLANs, flow tags and tag matching cannot, and a
 * CQ asking for them is refused (EOPNOTSUPP): the daemon stamps nothing.
 */
#define _GNU_SOURCE
#include "srn.h"

#include <errno.h>
#include <string.h>

static struct srn_cq *of(struct ibv_cq_ex *x) { return (struct srn_cq *)x; }

/* set makes the completion just taken the current one. */
static void set(struct srn_cq *q)
{
	q->cqx.status = q->cur.status;
	q->cqx.wr_id = q->cur.wr_id;
}

static int start_poll(struct ibv_cq_ex *x, struct ibv_poll_cq_attr *attr)
{
	if (attr && attr->comp_mask)
		return EINVAL;
	struct srn_cq *q = of(x);
	pthread_spin_lock(&q->evd.lock);
	int r = srn_cq_take(q, &q->cur);
	if (r > 0) {
		q->empty = 0;
		set(q);
		return 0; /* the lock held until end_poll */
	}
	pthread_spin_unlock(&q->evd.lock);
	if (r < 0)
		return EIO; /* overrun, or a broken ring */
	int err = srn_cq_found_empty(q);
	return err ? err : ENOENT;
}

static int next_poll(struct ibv_cq_ex *x)
{
	struct srn_cq *q = of(x);
	int r = srn_cq_take(q, &q->cur);
	if (r > 0) {
		set(q);
		return 0;
	}
	return r < 0 ? EIO : ENOENT;
}

static void end_poll(struct ibv_cq_ex *x) { pthread_spin_unlock(&of(x)->evd.lock); }

static enum ibv_wc_opcode read_opcode(struct ibv_cq_ex *x) { return of(x)->cur.opcode; }
static uint32_t read_vendor_err(struct ibv_cq_ex *x) { return of(x)->cur.vendor_err; }
static uint32_t read_byte_len(struct ibv_cq_ex *x) { return of(x)->cur.byte_len; }
/* the invalidated STag (ibv_wc_read_invalidated_rkey) shares the field */
static __be32 read_imm_data(struct ibv_cq_ex *x) { return of(x)->cur.imm_data; }
static uint32_t read_qp_num(struct ibv_cq_ex *x) { return of(x)->cur.qp_num; }
static uint32_t read_src_qp(struct ibv_cq_ex *x) { return of(x)->cur.src_qp; }
static unsigned int read_wc_flags(struct ibv_cq_ex *x) { return of(x)->cur.wc_flags; }
static uint32_t read_slid(struct ibv_cq_ex *x) { return of(x)->cur.slid; }
static uint8_t read_sl(struct ibv_cq_ex *x) { return of(x)->cur.sl; }
static uint8_t read_dlid_path_bits(struct ibv_cq_ex *x) { return of(x)->cur.dlid_path_bits; }
/* what a CQ cannot be made to give: nothing, rather than a crash */
static uint64_t read_none64(struct ibv_cq_ex *x) { (void)x; return 0; }
static uint16_t read_none16(struct ibv_cq_ex *x) { (void)x; return 0; }
static uint32_t read_none32(struct ibv_cq_ex *x) { (void)x; return 0; }
static void read_no_tm(struct ibv_cq_ex *x, struct ibv_wc_tm_info *tm)
{
	(void)x;
	memset(tm, 0, sizeof(*tm));
}

struct ibv_cq_ex *srn_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr)
{
	if (!attr || attr->cqe > INT32_MAX) {
		errno = EINVAL;
		return NULL;
	}
	if ((attr->wc_flags & ~(uint64_t)IBV_WC_STANDARD_FLAGS) ||
	    (attr->comp_mask & ~(uint32_t)IBV_CQ_INIT_ATTR_MASK_FLAGS) ||
	    ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & ~(uint32_t)IBV_CREATE_CQ_ATTR_SINGLE_THREADED))) {
		errno = EOPNOTSUPP; /* timestamps, parent domains, overruns ignored: not here */
		return NULL;
	}
	struct ibv_cq *cq = srn_create_cq(ctx, (int)attr->cqe, attr->cq_context, attr->channel, (int)attr->comp_vector);
	if (!cq)
		return NULL;
	struct ibv_cq_ex *x = &((struct srn_cq *)cq)->cqx;
	x->comp_mask = 0;
	x->start_poll = start_poll;
	x->next_poll = next_poll;
	x->end_poll = end_poll;
	x->read_opcode = read_opcode;
	x->read_vendor_err = read_vendor_err;
	x->read_byte_len = read_byte_len;
	x->read_imm_data = read_imm_data;
	x->read_qp_num = read_qp_num;
	x->read_src_qp = read_src_qp;
	x->read_wc_flags = read_wc_flags;
	x->read_slid = read_slid;
	x->read_sl = read_sl;
	x->read_dlid_path_bits = read_dlid_path_bits;
	x->read_completion_ts = read_none64;
	x->read_completion_wallclock_ns = read_none64;
	x->read_cvlan = read_none16;
	x->read_flow_tag = read_none32;
	x->read_tm_info = read_no_tm;
	return x;
}
