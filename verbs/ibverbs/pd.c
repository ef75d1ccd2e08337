/* Protection domains: the daemon's protection zones (ctl CreatePZ, FreePZ). */
#include "srn.h"

#include <errno.h>
#include <stdlib.h>

struct srn_pd {
	struct ibv_pd pd;
};

EXPORT struct ibv_pd *srn_alloc_pd(struct ibv_context *ctx)
{
	if (!ctx) {
		errno = EINVAL;
		return NULL;
	}
	struct srn_pd *p = calloc(1, sizeof(*p));
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	uint8_t reply[4];
	size_t got = 0;
	int err = srn_call(srn_session_of(ctx), SRN_OP_CREATE_PZ, NULL, 0, reply, sizeof(reply), &got);
	if (!err && got != sizeof(reply))
		err = EPROTO;
	if (err) {
		free(p);
		errno = err;
		return NULL;
	}
	p->pd.context = ctx;
	p->pd.handle = srn_get32(reply);
	return &p->pd;
}
SYMVER_DEFAULT(srn_alloc_pd, ibv_alloc_pd, "IBVERBS_1.1");

/* ibv_dealloc_pd: EBUSY while a registration or a QP uses the domain. */
EXPORT int srn_dealloc_pd(struct ibv_pd *pd)
{
	if (!pd)
		return EINVAL;
	uint8_t body[4];
	srn_put32(body, pd->handle);
	int err = srn_call(srn_session_of(pd->context), SRN_OP_FREE_PZ, body, sizeof(body), NULL, 0, NULL);
	if (err == ENODEV)
		err = 0; /* the daemon has gone, and the domain with it */
	if (!err)
		free(pd);
	return err;
}
SYMVER_DEFAULT(srn_dealloc_pd, ibv_dealloc_pd, "IBVERBS_1.1");
