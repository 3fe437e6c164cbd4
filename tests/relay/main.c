/* test_relay: the relay pipeline behind its seam, then the kvo-relay
 * process against a real ZMQ publisher and a real nats-server, then
 * against kvo-mocker (the engine's own cache as the reference). */
#include "kt.h"

#include <stdlib.h>

Suite *suite_pipe(void);
Suite *suite_e2e(void);
Suite *suite_mocker(void);

int main(void) {
    SRunner *sr = srunner_create(suite_pipe());
    srunner_add_suite(sr, suite_e2e());
    srunner_add_suite(sr, suite_mocker());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
