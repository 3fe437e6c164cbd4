/* test_wire: the codec and the shared basics. One suite per area. */
#include "kt.h"

#include <stdlib.h>

Suite *suite_basics(void);
Suite *suite_hash(void);
Suite *suite_plane(void);
Suite *suite_capture(void);
Suite *suite_http(void);
Suite *suite_proc(void);
Suite *suite_batch(void);
Suite *suite_hostile(void);
Suite *suite_tool(void);
Suite *suite_fuzz_replay(void);

int main(void) {
    SRunner *sr = srunner_create(suite_basics());
    srunner_add_suite(sr, suite_hash());
    srunner_add_suite(sr, suite_plane());
    srunner_add_suite(sr, suite_capture());
    srunner_add_suite(sr, suite_http());
    srunner_add_suite(sr, suite_proc());
    srunner_add_suite(sr, suite_batch());
    srunner_add_suite(sr, suite_hostile());
    srunner_add_suite(sr, suite_tool());
    srunner_add_suite(sr, suite_fuzz_replay());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
