/* test_indexer: the radix tree, its reference model, the feed, replay mode
 * the service and its Dynamo API. One suite per area. */
#include "kt.h"

Suite *suite_tree(void);
Suite *suite_model(void);
Suite *suite_feed(void);
Suite *suite_replay(void);
Suite *suite_service(void);
Suite *suite_fuzz_query(void);
Suite *suite_recover(void);
Suite *suite_heal(void);
Suite *suite_views(void);
Suite *suite_dynamo(void);

int main(int argc, char **argv) {
    static kt_suite_fn *const suites[] = {
        suite_tree,    suite_model,      suite_feed,    suite_replay,
        suite_service, suite_fuzz_query, suite_recover, suite_heal,
        suite_views,   suite_dynamo,
    };
    return kt_main(argc, argv, suites, KVO_ARRAY_LEN(suites));
}
