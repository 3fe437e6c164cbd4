/* test_indexer: the radix tree, its reference model, the feed, replay mode
 * and the service. One suite per area. */
#include "idx_test.h"

#include <stdlib.h>

int main(void) {
    SRunner *sr = srunner_create(suite_tree());
    srunner_add_suite(sr, suite_model());
    srunner_add_suite(sr, suite_feed());
    srunner_add_suite(sr, suite_replay());
    srunner_add_suite(sr, suite_service());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
