/* driver_bypass: a tenant that reaches the driver without libcuda's entry points (as raw
 * ioctls on /dev/nvidia* would): it charges the fake card's memory directly, so no interposer
 * sees it. Usage: driver_bypass MIB; prints "charged=1" when the driver took it, "charged=0"
 * when it refused (out of memory). */
#include <stdio.h>
#include <stdlib.h>
#include "fake_common.h"

int main(int argc, char **argv)
{
    unsigned long long mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 0;
    printf("charged=%d\n", fg_charge(0, mib << 20) == 0);
    return 0;
}
