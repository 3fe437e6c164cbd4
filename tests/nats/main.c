/* test_nats: the NATS client setup kvo-indexer and kvo-relay share
 * (kvo_nats): options and configuration, the connection against a real
 * nats-server, and both programs' shutdown while NATS is gone. */
#include "kt.h"

Suite *suite_cfg(void);
Suite *suite_conn(void);
Suite *suite_stop(void);

int main(int argc, char **argv) {
    static kt_suite_fn *const suites[] = {
        suite_cfg,
        suite_conn,
        suite_stop,
    };
    return kt_main(argc, argv, suites, KVO_ARRAY_LEN(suites));
}
