/* test_check: the oracle. Unit suites of the pure core and the report
 * writers, then end-to-end suites that run kvo-check against real processes
 * (nats-server, kvo-mocker, kvo-relay, kvo-indexer). */
#include "kt.h"

Suite *suite_core(void);
Suite *suite_route(void);
Suite *suite_sets(void);
Suite *suite_diag(void);
Suite *suite_report(void);
Suite *suite_browser(void);
Suite *suite_wait(void);
Suite *suite_answers(void);
Suite *suite_e2e(void);

int main(int argc, char **argv) {
    static kt_suite_fn *const suites[] = {
        suite_core,    suite_route, suite_sets,    suite_diag, suite_report,
        suite_browser, suite_wait,  suite_answers, suite_e2e,
    };
    return kt_main(argc, argv, suites, KVO_ARRAY_LEN(suites));
}
