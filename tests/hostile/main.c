/* test_hostile: the services under hostile input, all at once (issue 10):
 * real processes, every attack, then the same services still answering
 * correctly within their memory bounds. */
#include "kt.h"

#include <stdlib.h>

Suite *suite_services(void);

int main(int argc, char **argv) {
    /* One set of processes for the whole suite, and a ZMQ publisher the
     * tests share: no fork per test (ZMQ sockets do not survive one). */
    setenv("CK_FORK", "no", 0);
    static kt_suite_fn *const suites[] = {
        suite_services,
    };
    return kt_main(argc, argv, suites, KVO_ARRAY_LEN(suites));
}
