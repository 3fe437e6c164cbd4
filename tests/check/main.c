/* test_check: the oracle. Unit suites of the pure core and the report
 * writers, then end-to-end suites that run kvo-check against real processes
 * (nats-server, kvo-mocker, kvo-relay, kvo-indexer). */
#include "kt.h"

#include <stdlib.h>

Suite *suite_core(void);
Suite *suite_report(void);
Suite *suite_e2e(void);
Suite *suite_wait(void);

int main(void) {
    SRunner *sr = srunner_create(suite_core());
    srunner_add_suite(sr, suite_report());
    srunner_add_suite(sr, suite_wait());
    srunner_add_suite(sr, suite_e2e());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
