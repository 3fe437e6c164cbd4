/* kvo-bench-mocker: the floors kvo-mocker's trace mode is measured against,
 * on the same trace in the same run (tests/bench/mocker.sh).
 *
 *   kvo-bench-mocker read TRACE         parse every line (the reader alone)
 *   kvo-bench-mocker hash TRACE ALGO    + synthesize every prompt and hash
 *                                       all its full 16-token blocks once,
 *                                       no memo (what an engine hashing each
 *                                       prompt eagerly cannot go below)
 *
 * Prints one JSON line: requests, tokens, blocks, seconds (CPU time of the
 * process, so a busy machine inflates it less than wall time).
 */
#include "mock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[1], "read") && strcmp(argv[1], "hash")) ||
        (!strcmp(argv[1], "hash") && argc < 4)) {
        fprintf(stderr,
                "usage: kvo-bench-mocker read TRACE | hash TRACE ALGO\n");
        return 2;
    }
    bool hash = !strcmp(argv[1], "hash");
    wire_algo algo = WIRE_ALGO_SHA256;
    if (hash && wire_algo_parse(argv[3], &algo) != KVO_OK) {
        fprintf(stderr, "kvo-bench-mocker: unknown algo %s\n", argv[3]);
        return 2;
    }
    mock_trace *t;
    if (mock_trace_open(&t, argv[2]) != KVO_OK) {
        fprintf(stderr, "kvo-bench-mocker: cannot open %s\n", argv[2]);
        return 1;
    }
    mock_hasher *h = NULL;
    if (hash && mock_hasher_new(&h, algo, "0", 0) != KVO_OK) return 2;
    uint64_t *tok = NULL;
    mock_hash *bh = NULL;
    uint32_t cap = 0;
    uint64_t requests = 0, tokens = 0, blocks = 0;
    double t0 = cpu_seconds();
    mock_trace_req r;
    kvo_status st;
    while ((st = mock_trace_next(t, &r, NULL, 0)) != KVO_EOF) {
        if (st != KVO_OK) continue;
        requests++;
        tokens += r.input_length;
        if (!hash) continue;
        if (r.input_length > cap) {
            cap = r.input_length;
            tok = kvo_realloc(tok, (size_t)cap * sizeof(uint64_t));
            bh = kvo_realloc(bh, ((size_t)cap / 16 + 1) * sizeof(mock_hash));
            if (!tok || !bh) return 2;
        }
        mock_trace_tokens(r.hash_ids, r.n_hash_ids, r.input_length, tok);
        uint32_t nb = r.input_length / 16;
        if (mock_hasher_blocks(h, tok, 16, 0, nb, NULL, NULL, NULL, NULL, bh) !=
            KVO_OK)
            return 2;
        blocks += nb;
    }
    double secs = cpu_seconds() - t0;
    printf("{\"mode\":\"%s\",\"algo\":\"%s\",\"requests\":%llu,\"tokens\":%llu,"
           "\"blocks\":%llu,\"cpu_seconds\":%.6f}\n",
           argv[1], hash ? wire_algo_name(algo) : "-",
           (unsigned long long)requests, (unsigned long long)tokens,
           (unsigned long long)blocks, secs);
    kvo_free(tok);
    kvo_free(bh);
    mock_hasher_free(h);
    mock_trace_free(t);
    return 0;
}
