/*
 * A hostile DAT consumer: freed handles, handles of another IA, calls in
 * the wrong EP state, oversized posts, registrations of memory the process
 * does not own, requests the daemon must refuse after they are posted.
 * Each must get a DAT error or an error completion, never a crash; the
 * provider and the daemon must go on serving.
 *
 *   hostile IA_NAME PORT     (both IAs through IA_NAME; connects to itself)
 *
 * Prints "ok: ..." per check and "FAIL: ..." per failure; exits 1 if any
 * check failed, 2 if the setup did.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <dat2/udat.h>

static int failures;

static DAT_EVENT ev;

static void expect(const char *what, DAT_RETURN got, DAT_RETURN want_type)
{
	if (DAT_GET_TYPE(got) != want_type) {
		printf("FAIL: %s: got %#x, want type %#x (last event %#x)\n", what, got, want_type, ev.event_number);
		failures++;
	} else {
		printf("ok: %s (%#x)\n", what, got);
	}
}

#define MUST(what, call)                                                   \
	do {                                                               \
		DAT_RETURN r_ = (call);                                    \
		if (r_ != DAT_SUCCESS) {                                   \
			printf("FAIL: setup: %s: %#x\n", what, r_);        \
			exit(2);                                           \
		}                                                          \
	} while (0)

static DAT_EVENT wait_event(DAT_EVD_HANDLE evd, const char *what)
{
	DAT_EVENT ev;
	DAT_COUNT more;
	DAT_RETURN r = dat_evd_wait(evd, 10 * 1000 * 1000, 1, &ev, &more);
	if (r != DAT_SUCCESS) {
		printf("FAIL: setup: wait for %s: %#x\n", what, r);
		exit(2);
	}
	return ev;
}

/* send_error: a Send the daemon must refuse once it takes it: the post
 * succeeds and the Send's own completion (op SEND, cookie) carries a local
 * protection or length error. The EVD also holds the EP's receives, which
 * the error flushes: those are skipped. */
static void send_error(const char *what, DAT_EVD_HANDLE evd, DAT_RETURN posted, uint64_t cookie)
{
	DAT_EVENT e;
	DAT_COUNT more;
	int i;

	if (posted != DAT_SUCCESS) {
		printf("FAIL: %s: the post failed (%#x): the daemon's check is not reached\n", what, posted);
		failures++;
		return;
	}
	for (i = 0; i < 16; i++) {
		DAT_DTO_COMPLETION_EVENT_DATA *d = &e.event_data.dto_completion_event_data;
		if (dat_evd_wait(evd, 10 * 1000 * 1000, 1, &e, &more) != DAT_SUCCESS || e.event_number != DAT_DTO_COMPLETION_EVENT) {
			break;
		}
		if (d->operation != DAT_DTO_SEND)
			continue;
		if (d->user_cookie.as_64 == cookie &&
		    (d->status == DAT_DTO_ERR_LOCAL_PROTECTION || d->status == DAT_DTO_ERR_LOCAL_LENGTH)) {
			printf("ok: %s (completion status %d)\n", what, d->status);
			return;
		}
		printf("FAIL: %s: the Send completed with status %d, cookie %#llx\n", what, d->status,
		       (unsigned long long)d->user_cookie.as_64);
		failures++;
		return;
	}
	printf("FAIL: %s: no completion of the Send\n", what);
	failures++;
}

int main(int argc, char **argv)
{
	DAT_IA_HANDLE ia, ia2;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL, async2 = DAT_HANDLE_NULL;
	DAT_PZ_HANDLE pz, pz2, pz3;
	DAT_EVD_HANDLE cr_evd, conn_evd, dto_evd, evd2, conn2, dto2, spare;
	DAT_LMR_HANDLE lmr, lmr2;
	DAT_LMR_CONTEXT lctx, buf_ctx;
	DAT_RMR_CONTEXT rctx;
	DAT_VLEN rlen;
	DAT_VADDR raddr;
	DAT_REGION_DESCRIPTION region;
	DAT_EP_HANDLE ep, ep2, ep3;
	DAT_EP_ATTR attr;
	DAT_PSP_HANDLE psp, psp2;
	DAT_IA_ATTR ia_attr;
	DAT_COUNT more;
	DAT_LMR_TRIPLET iov[5];
	DAT_RMR_TRIPLET riov;
	DAT_DTO_COOKIE cookie = {.as_64 = 7};
	struct sockaddr_in self;
	DAT_CR_HANDLE cr;
	char *buf, *p;
	long page = sysconf(_SC_PAGESIZE);
	DAT_CONN_QUAL port;
	int i;

	if (argc != 3) {
		fprintf(stderr, "usage: hostile IA_NAME PORT\n");
		return 2;
	}
	port = strtoul(argv[2], NULL, 10);

	expect("open an IA no dat.conf names", dat_ia_open("no-such-ia", 8, &async, &ia), DAT_PROVIDER_NOT_FOUND);
	async = DAT_HANDLE_NULL;
	MUST("ia_open", dat_ia_open(argv[1], 8, &async, &ia));
	MUST("ia_open 2", dat_ia_open(argv[1], 8, &async2, &ia2));
	MUST("ia_query", dat_ia_query(ia, NULL, DAT_IA_FIELD_ALL, &ia_attr, 0, NULL));
	MUST("pz_create", dat_pz_create(ia, &pz));
	MUST("pz_create 2", dat_pz_create(ia2, &pz2));
	MUST("pz_create 3", dat_pz_create(ia, &pz3));
	MUST("pz_free 3", dat_pz_free(pz3));
	expect("free a freed PZ", dat_pz_free(pz3), DAT_INVALID_HANDLE);
	MUST("cr evd", dat_evd_create(ia, 8, DAT_HANDLE_NULL, DAT_EVD_CR_FLAG, &cr_evd));
	MUST("conn evd", dat_evd_create(ia, 8, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG, &conn_evd));
	MUST("dto evd", dat_evd_create(ia, 64, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &dto_evd));
	MUST("conn evd 2", dat_evd_create(ia, 8, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG, &conn2));
	MUST("dto evd 2", dat_evd_create(ia, 64, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &dto2));
	MUST("evd on IA 2", dat_evd_create(ia2, 8, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &evd2));
	expect("EVD of length 0", dat_evd_create(ia, 0, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &spare), DAT_INVALID_PARAMETER);
	expect("EVD with unknown flags", dat_evd_create(ia, 8, DAT_HANDLE_NULL, 0x40000, &spare), DAT_INVALID_PARAMETER);

	/* Memory. */
	buf = malloc(65536 + 100);
	region.for_va = buf + 100; /* not page-aligned, as malloc gives it */
	MUST("lmr_create", dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, 65536, pz, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA,
					  &lmr, &lctx, &rctx, &rlen, &raddr));
	if (raddr != (DAT_VADDR)(uintptr_t)(buf + 100) || rlen != 65536) {
		printf("FAIL: lmr_create reported %#llx+%llu for %p+65536\n", (unsigned long long)raddr, (unsigned long long)rlen,
		       (void *)(buf + 100));
		failures++;
	}
	buf_ctx = lctx;
	memset(buf, 0x5a, 65536 + 100); /* the registered memory is still the process's */
	expect("register with another IA's PZ",
	       dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, 4096, pz2, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA, &lmr2, &lctx,
			      &rctx, &rlen, &raddr),
	       DAT_INVALID_HANDLE);
	p = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(p, 2 * page);
	region.for_va = p;
	expect("register memory not mapped",
	       dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, page, pz, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA, &lmr2, &lctx,
			      &rctx, &rlen, &raddr),
	       DAT_INVALID_PARAMETER);
	region.for_va = (void *)0xffff800000001000ull;
	expect("register kernel addresses",
	       dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, page, pz, DAT_MEM_PRIV_LOCAL_READ_FLAG, DAT_VA_TYPE_VA, &lmr2, &lctx,
			      &rctx, &rlen, &raddr),
	       DAT_INVALID_PARAMETER);
	p = mmap(NULL, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	region.for_va = p;
	expect("register read-only memory for writing",
	       dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, page, pz, DAT_MEM_PRIV_LOCAL_WRITE_FLAG, DAT_VA_TYPE_VA, &lmr2,
			      &lctx, &rctx, &rlen, &raddr),
	       DAT_INVALID_PARAMETER);
	MUST("register read-only memory for reading",
	     dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, page, pz, DAT_MEM_PRIV_REMOTE_READ_FLAG, DAT_VA_TYPE_VA, &lmr2,
			    &lctx, &rctx, &rlen, &raddr));
	MUST("free it", dat_lmr_free(lmr2));
	expect("free a freed LMR", dat_lmr_free(lmr2), DAT_INVALID_HANDLE);
	p = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	region.for_va = p;
	expect("register past the end of a mapping",
	       dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, 64 * page, pz, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA, &lmr2, &lctx,
			      &rctx, &rlen, &raddr),
	       DAT_INVALID_PARAMETER);
	expect("register 0 octets",
	       dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, 0, pz, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA, &lmr2, &lctx, &rctx,
			      &rlen, &raddr),
	       DAT_INVALID_PARAMETER);
	expect("register shared memory (not implemented)",
	       dat_lmr_create(ia, DAT_MEM_TYPE_SHARED_VIRTUAL, region, page, pz, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA, &lmr2,
			      &lctx, &rctx, &rlen, &raddr),
	       DAT_NOT_IMPLEMENTED);
	expect("register zero-based (not supported)",
	       dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, page, pz, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_ZB, &lmr2, &lctx,
			      &rctx, &rlen, &raddr),
	       DAT_INVALID_PARAMETER);

	/* EPs. */
	memset(&attr, 0, sizeof(attr));
	attr.service_type = DAT_SERVICE_TYPE_RC;
	attr.max_recv_dtos = 4;
	attr.max_request_dtos = 4;
	attr.max_recv_iov = 4;
	attr.max_request_iov = 4;
	attr.max_rdma_read_in = attr.max_rdma_read_out = 4;
	expect("EP with another IA's PZ", dat_ep_create(ia, pz2, dto_evd, dto_evd, conn_evd, &attr, &ep3), DAT_INVALID_HANDLE);
	expect("EP with another IA's EVD", dat_ep_create(ia, pz, evd2, dto_evd, conn_evd, &attr, &ep3), DAT_INVALID_HANDLE);
	expect("EP with a freed PZ", dat_ep_create(ia, pz3, dto_evd, dto_evd, conn_evd, &attr, &ep3), DAT_INVALID_HANDLE);
	attr.max_recv_iov = 99;
	expect("EP with 99 receive segments", dat_ep_create(ia, pz, dto_evd, dto_evd, conn_evd, &attr, &ep3), DAT_INVALID_PARAMETER);
	attr.max_recv_iov = 4;
	attr.max_rdma_read_in = 1 << 20;
	expect("EP with an IRD of 2^20", dat_ep_create(ia, pz, dto_evd, dto_evd, conn_evd, &attr, &ep3), DAT_INVALID_PARAMETER);
	attr.max_rdma_read_in = 4;
	MUST("ep_create", dat_ep_create(ia, pz, dto_evd, dto_evd, conn_evd, &attr, &ep));
	MUST("ep_create 2", dat_ep_create(ia, pz, dto2, dto2, conn2, &attr, &ep2));
	for (i = 0; i < 5; i++) {
		iov[i].virtual_address = (DAT_VADDR)(uintptr_t)(buf + 100 + i * 64);
		iov[i].segment_length = 64;
		iov[i].lmr_context = buf_ctx;
	}
	expect("Send on an UNCONNECTED EP", dat_ep_post_send(ep, 1, iov, cookie, DAT_COMPLETION_DEFAULT_FLAG), DAT_INVALID_STATE);
	expect("Receive of 5 segments", dat_ep_post_recv(ep, 5, iov, cookie, DAT_COMPLETION_DEFAULT_FLAG), DAT_INVALID_PARAMETER);
	expect("Receive of -1 segments", dat_ep_post_recv(ep, -1, iov, cookie, DAT_COMPLETION_DEFAULT_FLAG), DAT_INVALID_PARAMETER);
	/* The queue holds 4 in the daemon's engine and 4 more in the ring
	 * on their way to it: the ninth Receive at the latest is refused. */
	for (i = 0; i < 16; i++) {
		DAT_RETURN r = dat_ep_post_recv(ep, 1, iov, cookie, DAT_COMPLETION_DEFAULT_FLAG);
		if (r != DAT_SUCCESS) {
			expect("Receives past the queue's depth", r, DAT_INSUFFICIENT_RESOURCES);
			break;
		}
	}
	if (i < 4 || i > 8) {
		printf("FAIL: %d Receives taken on a queue of 4\n", i);
		failures++;
	}
	expect("reset an UNCONNECTED EP", dat_ep_reset(ep), DAT_SUCCESS);
	expect("free an EVD an EP uses", dat_evd_free(dto_evd), DAT_INVALID_STATE);
	expect("free a PZ an EP uses", dat_pz_free(pz), DAT_INVALID_STATE);
	expect("wait out a 2 ms timeout", dat_evd_wait(dto_evd, 2000, 1, &ev, &more), DAT_TIMEOUT_EXPIRED);
	expect("wait for more events than the EVD holds", dat_evd_wait(dto_evd, 2000, 65, &ev, &more), DAT_INVALID_PARAMETER);
	expect("dequeue from an empty EVD", dat_evd_dequeue(dto_evd, &ev), DAT_QUEUE_EMPTY);

	/* Connect the two EPs through the loopback. */
	MUST("psp_create", dat_psp_create(ia, port, cr_evd, DAT_PSP_CONSUMER_FLAG, &psp));
	expect("a second PSP on the same qualifier", dat_psp_create(ia, port, cr_evd, DAT_PSP_CONSUMER_FLAG, &psp2),
	       DAT_CONN_QUAL_IN_USE);
	memset(&self, 0, sizeof(self));
	self = *(struct sockaddr_in *)ia_attr.ia_address_ptr;
	MUST("post_recv 2", dat_ep_post_recv(ep2, 1, iov, cookie, DAT_COMPLETION_DEFAULT_FLAG));
	MUST("ep_connect", dat_ep_connect(ep, (DAT_IA_ADDRESS_PTR)&self, port, 10 * 1000 * 1000, 4, "abcd",
					  DAT_QOS_BEST_EFFORT, DAT_CONNECT_DEFAULT_FLAG));
	expect("connect a connecting EP",
	       dat_ep_connect(ep, (DAT_IA_ADDRESS_PTR)&self, port, 1000000, 0, NULL, DAT_QOS_BEST_EFFORT, DAT_CONNECT_DEFAULT_FLAG),
	       DAT_INVALID_STATE);
	ev = wait_event(cr_evd, "the connection request");
	cr = ev.event_data.cr_arrival_event_data.cr_handle;
	MUST("EP on IA 2", dat_ep_create(ia2, pz2, evd2, evd2, DAT_HANDLE_NULL, &attr, &ep3));
	expect("accept on another IA's EP", dat_cr_accept(cr, ep3, 0, NULL), DAT_INVALID_HANDLE);
	expect("accept on no EP (a consumer PSP's CR)", dat_cr_accept(cr, DAT_HANDLE_NULL, 0, NULL), DAT_INVALID_HANDLE);
	expect("accept with 10^6 octets of private data", dat_cr_accept(cr, ep2, 1000000, buf), DAT_INVALID_PARAMETER);
	MUST("cr_accept", dat_cr_accept(cr, ep2, 0, NULL));
	expect("accept a CR twice", dat_cr_accept(cr, ep2, 0, NULL), DAT_INVALID_HANDLE);
	ev = wait_event(conn_evd, "ESTABLISHED (active)");
	if (ev.event_number != DAT_CONNECTION_EVENT_ESTABLISHED) {
		printf("FAIL: setup: active side got event %#x\n", ev.event_number);
		return 2;
	}
	ev = wait_event(conn2, "ESTABLISHED (passive)");
	expect("connect a connected EP",
	       dat_ep_connect(ep, (DAT_IA_ADDRESS_PTR)&self, port, 1000000, 0, NULL, DAT_QOS_BEST_EFFORT, DAT_CONNECT_DEFAULT_FLAG),
	       DAT_INVALID_STATE);
	expect("reset a CONNECTED EP", dat_ep_reset(ep), DAT_INVALID_STATE);
	expect("Send of 5 segments", dat_ep_post_send(ep, 5, iov, cookie, DAT_COMPLETION_DEFAULT_FLAG), DAT_INVALID_PARAMETER);
	expect("Read into 5 segments", dat_ep_post_rdma_read(ep, 5, iov, cookie, &riov, DAT_COMPLETION_DEFAULT_FLAG),
	       DAT_INVALID_PARAMETER);
	expect("Write with no remote buffer", dat_ep_post_rdma_write(ep, 1, iov, cookie, NULL, DAT_COMPLETION_DEFAULT_FLAG),
	       DAT_INVALID_PARAMETER);

	/* Requests the daemon refuses when it takes them: each completes in
	 * error and breaks the connection, so the first is the last. */
	iov[0].segment_length = 65536 + 4096; /* past the LMR's end */
	send_error("Send past the end of its LMR", dto_evd,
		   dat_ep_post_send(ep, 1, iov, (DAT_DTO_COOKIE){.as_64 = 0x5e5d}, DAT_COMPLETION_DEFAULT_FLAG), 0x5e5d);

	/* Freed handles. */
	MUST("ep_free", dat_ep_free(ep));
	expect("query a freed EP", dat_ep_query(ep, DAT_EP_FIELD_ALL, (DAT_EP_PARAM *)buf), DAT_INVALID_HANDLE);
	expect("post on a freed EP", dat_ep_post_send(ep, 1, iov, cookie, DAT_COMPLETION_DEFAULT_FLAG), DAT_INVALID_HANDLE);
	expect("free a freed EP", dat_ep_free(ep), DAT_INVALID_HANDLE);
	MUST("ep_free on IA 2", dat_ep_free(ep3));
	MUST("evd_free evd2", dat_evd_free(evd2));
	expect("dequeue from a freed EVD", dat_evd_dequeue(evd2, &ev), DAT_INVALID_HANDLE);
	expect("wait on a freed EVD", dat_evd_wait(evd2, 1000, 1, &ev, &more), DAT_INVALID_HANDLE);
	expect("close an IA with objects gracefully", dat_ia_close(ia, DAT_CLOSE_GRACEFUL_FLAG), DAT_INVALID_STATE);
	MUST("ia_close abrupt", dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG));
	expect("query an EVD of a closed IA", dat_evd_dequeue(dto_evd, &ev), DAT_INVALID_HANDLE);
	expect("post on an EP of a closed IA", dat_ep_post_recv(ep2, 1, iov, cookie, DAT_COMPLETION_DEFAULT_FLAG),
	       DAT_INVALID_HANDLE);
	MUST("ia_close 2", dat_ia_close(ia2, DAT_CLOSE_ABRUPT_FLAG));

	/* The provider and the daemon still serve. */
	async = DAT_HANDLE_NULL;
	MUST("ia_open again", dat_ia_open(argv[1], 8, &async, &ia));
	MUST("pz_create again", dat_pz_create(ia, &pz));
	region.for_va = buf;
	MUST("lmr_create again", dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, 4096, pz, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA,
						&lmr, &lctx, &rctx, &rlen, &raddr));
	MUST("lmr_free again", dat_lmr_free(lmr));
	MUST("pz_free again", dat_pz_free(pz));
	MUST("ia_close again", dat_ia_close(ia, DAT_CLOSE_GRACEFUL_FLAG));
	for (i = 0; i < 65536 + 100; i++)
		if (buf[i] != 0x5a) {
			printf("FAIL: registered memory changed at %d\n", i);
			failures++;
			break;
		}
	free(buf);
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
