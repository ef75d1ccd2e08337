/*
 * unsupported: what the library does not implement fails in the way its
 * function's callers test for: -1, NULL, 0 flags or an errno value, as
 * rdma-core's own functions fail, never a value that reads as success.
 * Prints "ok" and exits 0, or names what failed.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n != 1)
		FAIL("%d devices", n);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd)
		FAIL("open/alloc_pd: %m");
	char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		FAIL("ibv_reg_mr: %m");
	int r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
	if (r >= 0)
		FAIL("ibv_rereg_mr returned %d", r);
	if ((r = ibv_get_pkey_index(ctx, 1, 0x1234)) >= 0)
		FAIL("ibv_get_pkey_index of a P_Key the port lacks: %d", r);
	errno = 0;
	if ((r = rsocket(AF_INET, SOCK_STREAM, 0)) != -1 || errno != EOPNOTSUPP)
		FAIL("rsocket: %d, errno %d", r, errno);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("ok\n");
	return 0;
}
