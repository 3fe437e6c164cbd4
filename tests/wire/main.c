/* test_wire: the codec. One suite per area. */
#include "kt.h"

Suite *suite_hash(void);
Suite *suite_plane(void);
Suite *suite_capture(void);
Suite *suite_batch(void);
Suite *suite_hostile(void);
Suite *suite_tool(void);
Suite *suite_recovery(void);
Suite *suite_fuzz_replay(void);

int main(int argc, char **argv) {
    static kt_suite_fn *const suites[] = {
        suite_hash,    suite_plane, suite_capture,  suite_batch,
        suite_hostile, suite_tool,  suite_recovery, suite_fuzz_replay,
    };
    return kt_main(argc, argv, suites, KVO_ARRAY_LEN(suites));
}
