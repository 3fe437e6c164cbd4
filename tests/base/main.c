/* test_base: the runtime every program uses -- status table, buffers,
 * arenas, parsing, allocation failure injection, the HTTP server and client,
 * child processes. One suite per area. */
#include "kt.h"

Suite *suite_basics(void);
Suite *suite_http(void);
Suite *suite_proc(void);
Suite *suite_json(void);

int main(int argc, char **argv) {
    static kt_suite_fn *const suites[] = {
        suite_basics,
        suite_http,
        suite_proc,
        suite_json,
    };
    return kt_main(argc, argv, suites, KVO_ARRAY_LEN(suites));
}
