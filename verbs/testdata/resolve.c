/*
 * resolve: rdma_resolve_addr of ADDR ends in ADDR_RESOLVED or ADDR_ERROR,
 * as the second argument says; "unreachable": it resolves, and a connect
 * to it ends in UNREACHABLE with ETIMEDOUT (no host answers there).
 * Prints "ok" and exits 0, or names what failed.
 *
 *   resolve ADDR resolved|error|unreachable
 */
#include <arpa/inet.h>
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		fprintf(stderr, "channel/id: %s\n", strerror(errno));
		return 1;
	}
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(7)};
	inet_pton(AF_INET, argv[1], &a.sin_addr);
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000)) {
		fprintf(stderr, "rdma_resolve_addr: %s\n", strerror(errno));
		return 1;
	}
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e)) {
		fprintf(stderr, "rdma_get_cm_event: %s\n", strerror(errno));
		return 1;
	}
	int connect = strcmp(argv[2], "unreachable") == 0;
	enum rdma_cm_event_type want =
		strcmp(argv[2], "error") != 0 ? RDMA_CM_EVENT_ADDR_RESOLVED : RDMA_CM_EVENT_ADDR_ERROR;
	if (e->event != want) {
		fprintf(stderr, "%s: %s (status %d), want %s\n", argv[1], rdma_event_str(e->event), e->status,
			rdma_event_str(want));
		return 1;
	}
	rdma_ack_cm_event(e);
	if (connect) {
		struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
		struct ibv_cq *cq = pd ? ibv_create_cq(id->verbs, 4, NULL, NULL, 0) : NULL;
		struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
		if (!cq || rdma_resolve_route(id, 2000) || rdma_get_cm_event(ch, &e) || e->event != RDMA_CM_EVENT_ROUTE_RESOLVED) {
			fprintf(stderr, "route: %s\n", strerror(errno));
			return 1;
		}
		rdma_ack_cm_event(e);
		if (rdma_create_qp(id, pd, &qa) || rdma_connect(id, NULL)) {
			fprintf(stderr, "connect: %s\n", strerror(errno));
			return 1;
		}
		if (rdma_get_cm_event(ch, &e)) {
			fprintf(stderr, "rdma_get_cm_event: %s\n", strerror(errno));
			return 1;
		}
		if (e->event != RDMA_CM_EVENT_UNREACHABLE || e->status != -ETIMEDOUT) {
			fprintf(stderr, "connect to %s: %s (status %d), want UNREACHABLE (%d)\n", argv[1],
				rdma_event_str(e->event), e->status, -ETIMEDOUT);
			return 1;
		}
		rdma_ack_cm_event(e);
		rdma_destroy_qp(id);
		ibv_destroy_cq(cq);
		ibv_dealloc_pd(pd);
	}
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	printf("ok\n");
	return 0;
}
