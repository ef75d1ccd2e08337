/*
 * Another thread writes beside a buffer while the buffer is registered and
 * deregistered (the neighbours of a malloc'ed buffer share its first and
 * last pages): no write may be lost (internal/memreg; the provider holds
 * the writer for the moment its page moves, dapl/move.c).
 *
 *   neighbours IA_NAME PORT
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <dat2/udat.h>

struct counters {
	volatile uint64_t *first, *last;
};

static struct counters *volatile target, *volatile using;
static volatile int stop, lost;
static volatile uint64_t seen;

static void *writer(void *arg)
{
	struct counters *cur = NULL;
	uint64_t want = 0;
	(void)arg;
	while (!stop) {
		struct counters *c = __atomic_load_n(&target, __ATOMIC_SEQ_CST);
		__atomic_store_n(&using, c, __ATOMIC_SEQ_CST);
		if (c == NULL)
			continue;
		if (c != cur) {
			cur = c;
			want = __atomic_load_n(c->first, __ATOMIC_SEQ_CST);
		}
		want++;
		uint64_t a = __atomic_add_fetch(c->first, 1, __ATOMIC_SEQ_CST);
		uint64_t l = __atomic_add_fetch(c->last, 1, __ATOMIC_SEQ_CST);
		if (a != want || l != want) {
			printf("FAIL: counters at %llu and %llu, want %llu\n", (unsigned long long)a, (unsigned long long)l,
			       (unsigned long long)want);
			lost = 1;
			__atomic_store_n(&using, NULL, __ATOMIC_SEQ_CST);
			return NULL;
		}
		__atomic_add_fetch(&seen, 1, __ATOMIC_SEQ_CST);
	}
	__atomic_store_n(&using, NULL, __ATOMIC_SEQ_CST);
	return NULL;
}

int main(int argc, char **argv)
{
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_PZ_HANDLE pz;
	DAT_LMR_HANDLE lmr;
	DAT_LMR_CONTEXT lctx;
	DAT_RMR_CONTEXT rctx;
	DAT_VLEN rlen;
	DAT_VADDR raddr;
	DAT_REGION_DESCRIPTION region;
	long page = sysconf(_SC_PAGESIZE);
	static struct counters cs[200]; /* one per iteration: the writer tells them apart by address */
	pthread_t th;
	int i;

	if (argc < 2)
		return 2;
	if (dat_ia_open(argv[1], 8, &async, &ia) != DAT_SUCCESS || dat_pz_create(ia, &pz) != DAT_SUCCESS) {
		printf("FAIL: setup\n");
		return 2;
	}
	pthread_create(&th, NULL, writer, NULL);
	for (i = 0; i < 200 && !lost; i++) {
		char *b = mmap(NULL, 6 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		uint64_t n = __atomic_load_n(&seen, __ATOMIC_SEQ_CST);
		cs[i] = (struct counters){(uint64_t *)(b + page + 8), (uint64_t *)(b + 4 * page + 64)};
		__atomic_store_n(&target, &cs[i], __ATOMIC_SEQ_CST);
		while (__atomic_load_n(&seen, __ATOMIC_SEQ_CST) < n + 10 && !lost)
			sched_yield();
		region.for_va = b + page + 32;
		if (dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, 3 * page, pz, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA, &lmr, &lctx,
				   &rctx, &rlen, &raddr) != DAT_SUCCESS ||
		    dat_lmr_free(lmr) != DAT_SUCCESS) {
			printf("FAIL: register %d\n", i);
			lost = 1;
		}
		__atomic_store_n(&target, NULL, __ATOMIC_SEQ_CST);
		while (__atomic_load_n(&using, __ATOMIC_SEQ_CST) != NULL)
			sched_yield();
		munmap(b, 6 * page);
	}
	stop = 1;
	pthread_join(th, NULL);
	dat_pz_free(pz);
	dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG);
	if (lost)
		return 1;
	printf("ok: 200 registrations beside a writer, no write lost\n");
	return 0;
}
