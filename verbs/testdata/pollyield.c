/*
 * pollyield: how many system calls ibv_poll_cq makes polling an empty CQ,
 * pinned to one CPU. sched_yield is trapped by a seccomp filter and
 * counted; every other call is allowed. Prints "ok" and exits 0 when the
 * count is what the second argument says ("none" or "some"), or names
 * what failed.
 *
 *   pollyield CPU none|some
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/ucontext.h>

#include "check.h"

enum { POLLS = 10000 };

static volatile sig_atomic_t yields;

/* SIGSYS: a trapped sched_yield, counted and made to return 0 */
static void trapped(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)si;
	yields++;
	((ucontext_t *)uc)->uc_mcontext.gregs[REG_RAX] = 0;
}

static void trap_sched_yield(void)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sched_yield, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
	struct sigaction sa = {.sa_sigaction = trapped, .sa_flags = SA_SIGINFO};
	if (sigaction(SIGSYS, &sa, NULL))
		FAIL("sigaction");
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
		FAIL("seccomp: %m");
}

int main(int argc, char **argv)
{
	if (argc != 3)
		FAIL("usage: pollyield CPU none|some");
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(atoi(argv[1]), &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		FAIL("sched_setaffinity: %m");
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n != 1)
		FAIL("%d devices", n);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("ibv_open_device: %m");
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!cq)
		FAIL("ibv_create_cq: %m");
	trap_sched_yield();
	sched_yield(); /* the trap works */
	if (yields != 1)
		FAIL("sched_yield not trapped");
	yields = 0;
	struct ibv_wc wc;
	for (int i = 0; i < POLLS; i++)
		if (ibv_poll_cq(cq, 1, &wc) != 0)
			FAIL("poll %d of an empty CQ found a completion", i);
	int want_some = strcmp(argv[2], "some") == 0;
	if (want_some ? yields == 0 : yields != 0)
		FAIL("%d sched_yield in %d polls on CPU %s, want %s", (int)yields, POLLS, argv[1], argv[2]);
	ibv_destroy_cq(cq);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("ok\n");
	return 0;
}
