/* test_relay: the relay pipeline behind its seam, its ZMQ sources alone,
 * then the kvo-relay process against a real ZMQ publisher and a real
 * nats-server, then against kvo-mocker (the engine's own cache as the
 * reference). */
#include "kt.h"

Suite *suite_pipe(void);
Suite *suite_recover(void);
Suite *suite_source(void);
Suite *suite_e2e(void);
Suite *suite_mocker(void);

int main(int argc, char **argv) {
    static kt_suite_fn *const suites[] = {
        suite_pipe, suite_recover, suite_source, suite_e2e, suite_mocker,
    };
    return kt_main(argc, argv, suites, KVO_ARRAY_LEN(suites));
}
