/*
 * Memory registration: any range of the process's own memory, registered
 * with the daemon, which reaches it through /proc/PID/mem (ctl
 * RegisterProcessMemory, internal/procmem). Nothing is moved,
 * shared or pinned: a 16-octet field of a heap struct registers alone,
 * its neighbours stay private, and a child of fork keeps the memory it
 * copied while the daemon goes on with its parent's.
 */
#include "srn.h"

#include <errno.h>
#include <stdlib.h>

int srn_register(struct srn_session *s, uint32_t pz, const void *addr, size_t len, uint8_t access, uint32_t *lmr,
		 uint32_t *stag)
{
	struct srn_w w = {0};
	srn_wn(&w, pz, 4);
	srn_wn(&w, (uintptr_t)addr, 8);
	srn_wn(&w, len, 8);
	srn_wn(&w, access, 1);
	uint8_t reply[8];
	size_t got = 0;
	int err = srn_call(s, SRN_OP_REGISTER_PROCESS_MEMORY, w.b, w.n, reply, sizeof(reply), &got);
	if (!err && got != sizeof(reply))
		err = EPROTO;
	if (err)
		return err;
	*lmr = srn_get32(reply);
	*stag = srn_get32(reply + 4);
	return 0;
}

int srn_free_lmr(struct srn_session *s, uint32_t lmr)
{
	uint8_t b[4];
	srn_put32(b, lmr);
	int err = srn_call(s, SRN_OP_FREE_LMR, b, sizeof(b), NULL, 0, NULL);
	return err == ENODEV ? 0 : err; /* the daemon has gone, and the region with it */
}

/* The access flags of verbs as the daemon's rights. The optional flags
 * (IBV_ACCESS_OPTIONAL_RANGE: relaxed ordering, which perftest always
 * asks for) are hints a provider may ignore; a flag that changes the
 * meaning of the region (zero-based, on-demand, memory windows) is not
 * supported. Remote write and atomics need local write (ibv_reg_mr(3)). */
static int rights(int access, uint8_t *out)
{
	access &= ~IBV_ACCESS_OPTIONAL_RANGE;
	const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	if (access & ~known)
		return EOPNOTSUPP;
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
		return EINVAL;
	*out = (access & IBV_ACCESS_LOCAL_WRITE ? SRN_ACCESS_LOCAL_WRITE : 0) |
	       (access & IBV_ACCESS_REMOTE_READ ? SRN_ACCESS_REMOTE_READ : 0) |
	       (access & IBV_ACCESS_REMOTE_WRITE ? SRN_ACCESS_REMOTE_WRITE : 0) |
	       (access & IBV_ACCESS_REMOTE_ATOMIC ? SRN_ACCESS_REMOTE_ATOMIC : 0);
	return 0;
}

static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access)
{
	uint8_t r = 0;
	int err = !pd || !len ? EINVAL : rights(access, &r);
	/* The region is addressed by its virtual addresses: an iova of its
	 * own would need a translation the daemon does not keep. */
	if (!err && iova != (uintptr_t)addr)
		err = EOPNOTSUPP;
	struct ibv_mr *mr = err ? NULL : calloc(1, sizeof(*mr));
	if (!err && !mr)
		err = ENOMEM;
	uint32_t lmr = 0, stag = 0;
	if (!err)
		err = srn_register(srn_session_of(pd->context), pd->handle, addr, len, r, &lmr, &stag);
	if (err) {
		free(mr);
		errno = err;
		return NULL;
	}
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = addr;
	mr->length = len;
	mr->handle = lmr;
	mr->lkey = mr->rkey = stag;
	return mr;
}

EXPORT struct ibv_mr *srn_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return reg(pd, addr, len, (uintptr_t)addr, access);
}
SYMVER_DEFAULT(srn_reg_mr, ibv_reg_mr, "IBVERBS_1.1");

/* verbs.h makes both names macros for its inline choice between them */
#undef ibv_reg_mr_iova
#undef ibv_reg_mr

EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access)
{
	return reg(pd, addr, len, iova, access);
}

EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned int access)
{
	return reg(pd, addr, len, iova, (int)access);
}

/* ibv_dereg_mr: EBUSY while a work request uses the region. */
EXPORT int srn_dereg_mr(struct ibv_mr *mr)
{
	if (!mr)
		return EINVAL;
	int err = srn_free_lmr(srn_session_of(mr->context), mr->handle);
	if (!err)
		free(mr);
	return err;
}
SYMVER_DEFAULT(srn_dereg_mr, ibv_dereg_mr, "IBVERBS_1.1");
