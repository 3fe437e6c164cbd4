/* mt.h -- helpers shared by the mocker's test suites. */
#ifndef MT_H
#define MT_H

#include "kt.h"
#include "mock_int.h"

/* What a request's callbacks reported. */
typedef struct mt_out {
    uint32_t n_output;
    uint64_t tokens[4096];
    mock_finish finish;
    uint32_t cached;
    uint32_t n_blocks_at_finish;
    uint32_t callbacks;
} mt_out;

void mt_on_output(void *user, const mock_output *o);

/* An engine (and its own hasher) for cfg, rank 0 unless given. */
typedef struct mt_eng {
    mock_cfg cfg;
    mock_hasher *h;
    mock_engine *e;
    mock_render *r;
    wire_batch last;      /* the last step's batch, decoded from its bytes */
    bool last_set;
    double last_ms;
} mt_eng;

void mt_cfg(mock_cfg *c, uint32_t block_size, uint32_t num_gpu_blocks);
void mt_eng_init(mt_eng *m, const mock_cfg *c, uint32_t rank);
void mt_eng_fini(mt_eng *m);
/* Add a request of n tokens (copied), max_tokens m; returns its id. */
uint64_t mt_add(mt_eng *m, const uint64_t *tok, uint32_t n, uint32_t max_tokens,
                mt_out *out);
/* One whole step (schedule + complete). Returns true when events were
 * published; m->last holds them (encoded with the renderer, decoded back). */
bool mt_step(mt_eng *m, mock_step *st);
/* Steps until idle; returns the number of steps. Every batch is passed to
 * fn (may be NULL). */
typedef void (*mt_batch_fn)(void *ctx, const wire_batch *b);
uint32_t mt_run(mt_eng *m, mt_batch_fn fn, void *ctx);

/* Events seen, flattened (first 256). */
typedef struct mt_rec {
    uint32_t n;
    wire_ev_type type[256];
    uint64_t key[256];    /* first hash */
    uint32_t nh[256];
    uint64_t parent[256];
    bool has_parent[256];
} mt_rec;
/* An mt_batch_fn: appends b's events to the mt_rec ctx. */
void mt_record(void *ctx, const wire_batch *b);

/* Start the kvo-mocker binary with --port <a free port> and args, and wait
 * for /health. Another process can take the port between kvo_free_port and
 * the bind (the mocker then exits 2 at once): retried on a fresh port.
 * Returns the port. */
uint16_t mt_mocker_spawn(kt_proc *p, const char *const args[]);

/* tokens 1..n */
void mt_iota(uint64_t *t, uint32_t n, uint64_t first);

#endif /* MT_H */
