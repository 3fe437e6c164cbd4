/* test_mocker: the mock engine (block pool, scheduler, hashes), its trace
 * reader, renderer and mutations, publisher and replay protocol, the HTTP
 * API of the real kvo-mocker binary, and a long random workload checked
 * against the indexer's tree. */
#include "kt.h"

#include <stdlib.h>

Suite *suite_engine(void);
Suite *suite_trace(void);
Suite *suite_mutate(void);
Suite *suite_pub(void);
Suite *suite_workload(void);
Suite *suite_http(void);
Suite *suite_stop(void);

int main(void) {
    SRunner *sr = srunner_create(suite_engine());
    srunner_add_suite(sr, suite_trace());
    srunner_add_suite(sr, suite_mutate());
    srunner_add_suite(sr, suite_pub());
    srunner_add_suite(sr, suite_workload());
    srunner_add_suite(sr, suite_http());
    srunner_add_suite(sr, suite_stop());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
