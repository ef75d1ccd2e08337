/*
 * portbind: rdma_bind_addr reserves its port with the daemon, as the
 * kernel's RDMA-CM reserves it on the host: a second bind of the port is
 * EADDRINUSE while the first id holds it, bound or listening; port 0
 * picks a different free port each time; a port comes free when its id
 * is destroyed. Prints "ok" and exits 0, or names what failed.
 *
 *   portbind PORT
 */
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static struct rdma_event_channel *ch;

static struct rdma_cm_id *id(void)
{
	struct rdma_cm_id *i;
	if (rdma_create_id(ch, &i, NULL, RDMA_PS_TCP))
		FAIL("rdma_create_id: %s", strerror(errno));
	return i;
}

static int bind_port(struct rdma_cm_id *i, int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	a.sin_addr.s_addr = htonl(0x7f000001);
	return rdma_bind_addr(i, (struct sockaddr *)&a);
}

static void refused(struct rdma_cm_id *i, int port, const char *while_)
{
	if (bind_port(i, port) == 0 || errno != EADDRINUSE)
		FAIL("a second bind of port %d while %s: %s, want EADDRINUSE", port, while_, strerror(errno));
}

int main(int argc, char **argv)
{
	int port = argc > 1 ? atoi(argv[1]) : 7999;
	if (!(ch = rdma_create_event_channel()))
		FAIL("rdma_create_event_channel: %s", strerror(errno));
	struct rdma_cm_id *a = id(), *b = id(), *c = id(), *d = id(), *e = id();
	if (bind_port(a, port))
		FAIL("bind port %d: %s", port, strerror(errno));
	refused(b, port, "the first id is bound");
	if (rdma_listen(a, 4))
		FAIL("rdma_listen: %s", strerror(errno));
	refused(b, port, "the first id listens");
	if (bind_port(c, 0) || bind_port(d, 0))
		FAIL("bind port 0: %s", strerror(errno));
	int pc = ntohs(rdma_get_src_port(c)), pd = ntohs(rdma_get_src_port(d));
	if (pc == 0 || pd == 0 || pc == pd)
		FAIL("port 0 gave ports %d and %d", pc, pd);
	refused(e, pc, "an id holds it from port 0");
	/* rdma_resolve_addr with a source address binds an id not bound
	 * yet, and leaves a bound one as it is, as the kernel's does */
	struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET, .sin_port = htons(port)};
	src.sin_addr.s_addr = dst.sin_addr.s_addr = htonl(0x7f000001);
	for (int k = 0; k < 2; k++) {
		if (rdma_resolve_addr(d, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000))
			FAIL("rdma_resolve_addr %d of a bound id with a source address: %s", k, strerror(errno));
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev) || ev->event != RDMA_CM_EVENT_ADDR_RESOLVED)
			FAIL("resolve %d: %s", k, strerror(errno));
		rdma_ack_cm_event(ev);
		if (ntohs(rdma_get_src_port(d)) != pd)
			FAIL("resolve %d moved the bound id from port %d to %d", k, pd, ntohs(rdma_get_src_port(d)));
	}
	rdma_destroy_id(a);
	if (bind_port(b, port) || rdma_listen(b, 4))
		FAIL("bind and listen on port %d after its id went: %s", port, strerror(errno));
	rdma_destroy_id(c);
	if (bind_port(e, pc))
		FAIL("bind port %d after its id went: %s", pc, strerror(errno));
	rdma_destroy_id(b);
	rdma_destroy_id(d);
	rdma_destroy_id(e);
	rdma_destroy_event_channel(ch);
	printf("ok\n");
	return 0;
}
