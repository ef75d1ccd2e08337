/*
 * rates: every answer of the static rate conversions, for rates, multiples
 * and Mbit/s values in and around the enumeration, one per line, so that
 * two libraries' answers can be compared.
 */
#include <infiniband/verbs.h>
#include <stdio.h>

int main(void)
{
	for (int r = -2; r < 40; r++)
		printf("rate %d: mult %d mbps %d\n", r, ibv_rate_to_mult((enum ibv_rate)r),
		       ibv_rate_to_mbps((enum ibv_rate)r));
	for (int m = -2; m < 500; m++)
		printf("mult %d: rate %d\n", m, (int)mult_to_ibv_rate(m));
	for (int r = 0; r < 40; r++) {
		int mbps = ibv_rate_to_mbps((enum ibv_rate)r);
		for (int d = -1; d <= 1; d++)
			printf("mbps %d: rate %d\n", mbps + d, (int)mbps_to_ibv_rate(mbps + d));
	}
	printf("mbps 0: rate %d\n", (int)mbps_to_ibv_rate(0));
	return 0;
}
