/* test_nats: the NATS client setup kvo-indexer and kvo-relay share
 * (kvo_nats): options and configuration, the connection against a real
 * nats-server, and both programs' shutdown while NATS is gone. */
#include "kt.h"

#include <stdlib.h>

Suite *suite_cfg(void);
Suite *suite_conn(void);
Suite *suite_stop(void);

int main(void) {
    SRunner *sr = srunner_create(suite_cfg());
    srunner_add_suite(sr, suite_conn());
    srunner_add_suite(sr, suite_stop());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
