/* test_mocker: the mock engine (block pool, scheduler, hashes), its trace
 * reader, renderer and mutations, publisher and replay protocol, the HTTP
 * API of the real kvo-mocker binary, its request body parsers (and their
 * fuzz corpora), and a long random workload checked against the indexer's
 * tree. */
#include "kt.h"

Suite *suite_engine(void);
Suite *suite_trace(void);
Suite *suite_mutate(void);
Suite *suite_pub(void);
Suite *suite_workload(void);
Suite *suite_http(void);
Suite *suite_stop(void);
Suite *suite_node(void);
Suite *suite_request(void);
Suite *suite_keys(void);
Suite *suite_tiers(void);

int main(int argc, char **argv) {
    static kt_suite_fn *const suites[] = {
        suite_engine,   suite_trace, suite_mutate, suite_pub,
        suite_workload, suite_http,  suite_stop,   suite_node,
        suite_request,  suite_keys,  suite_tiers,
    };
    return kt_main(argc, argv, suites, KVO_ARRAY_LEN(suites));
}
