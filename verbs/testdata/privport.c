/*
 * privport: rdma_bind_addr and rdma_listen of a privileged port succeed or
 * fail with EACCES, as the second argument says, as the kernel's RDMA-CM
 * decides by CAP_NET_BIND_SERVICE over the network namespace. Prints "ok"
 * and exits 0, or names what failed.
 *
 *   privport PORT ok|eacces
 */
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	int want_ok = strcmp(argv[2], "ok") == 0;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		fprintf(stderr, "channel/id: %s\n", strerror(errno));
		return 1;
	}
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	a.sin_addr.s_addr = htonl(0x7f000001);
	int r = rdma_bind_addr(id, (struct sockaddr *)&a);
	if (r == 0)
		r = rdma_listen(id, 1);
	if (want_ok ? r != 0 : r == 0 || errno != EACCES) {
		fprintf(stderr, "bind and listen on port %s: %d (%s), want %s\n", argv[1], r, r ? strerror(errno) : "ok", argv[2]);
		return 1;
	}
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	printf("ok\n");
	return 0;
}
