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
    wire_batch last; /* the last step's batch, decoded from its bytes */
    bool last_set;
    double last_ms;
} mt_eng;

void mt_cfg(mock_cfg *c, uint32_t block_size, uint32_t num_gpu_blocks);
void mt_eng_init(mt_eng *m, const mock_cfg *c, uint32_t rank);
/* mt_eng_init of mt_cfg(block_size, num_gpu_blocks), rank 0. */
void mt_eng_start(mt_eng *m, uint32_t block_size, uint32_t num_gpu_blocks);
void mt_eng_fini(mt_eng *m);
/* A request of tok[0..n) (copied at add) whose callbacks fill out. */
mock_req_in mt_req(const uint64_t *tok, uint32_t n, uint32_t max_tokens,
                   mt_out *out);
/* Add a request of n tokens (copied), max_tokens m; returns its id. */
uint64_t mt_add(mt_eng *m, const uint64_t *tok, uint32_t n, uint32_t max_tokens,
                mt_out *out);
/* The engine's counters now. */
mock_engine_stats mt_stats(const mt_eng *m);
/* Block id's state (ck_assert that it exists). */
mock_block_info mt_block(const mt_eng *m, uint32_t id);
/* Engine hashes of the first n_blocks full blocks of tok (no LoRA, salt). */
void mt_hash(mt_eng *m, const uint64_t *tok, uint32_t n_blocks, mock_hash *out);
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
    uint64_t key[256]; /* first hash */
    uint32_t nh[256];
    uint64_t parent[256];
    bool has_parent[256];
} mt_rec;
/* An mt_batch_fn: appends b's events to the mt_rec ctx. */
void mt_record(void *ctx, const wire_batch *b);
/* mt_add, then steps until idle, every batch recorded into rec (may be
 * NULL); returns the request's id. */
uint64_t mt_add_run(mt_eng *m, const uint64_t *tok, uint32_t n,
                    uint32_t max_tokens, mt_out *out, mt_rec *rec);

/* A cached set as the events describe it: per block hash the copies
 * stored minus removed, and over the hashes with copies left their count
 * and digest (kvo_block_digest with the parent of the first copy) -- what
 * a checkpoint compares with the engine's set. Open addressing,
 * MT_SET_CAP hashes at most. */
#define MT_SET_CAP (1u << 16)
typedef struct mt_set {
    uint64_t key[MT_SET_CAP], parent[MT_SET_CAP];
    uint32_t count[MT_SET_CAP];
    bool used[MT_SET_CAP], has_parent[MT_SET_CAP];
    uint64_t distinct, digest;
} mt_set;

/* A copy of k stored under its parent. */
void mt_set_add(mt_set *s, uint64_t k, bool has_parent, uint64_t parent);
/* A copy of k removed (ck_assert that one was stored); returns the copies
 * left. */
uint32_t mt_set_del(mt_set *s, uint64_t k);
/* Everything dropped (AllBlocksCleared). */
void mt_set_clear(mt_set *s);

/* A NULL-terminated argument list in place: MT_ARGS("--dp-size", "2"). */
#define MT_ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Start the kvo-mocker binary with --port <a free port> and args, and wait
 * for /health. Another process can take the port between kvo_free_port and
 * the bind (the mocker then exits 2 at once): retried on a fresh port.
 * Returns the port. */
uint16_t mt_mocker_spawn(kt_proc *p, const char *const args[]);

/* tokens first, first + 1, ... (n of them) */
void mt_iota(uint64_t *t, uint32_t n, uint64_t first);

/* ---- sockets and suites -------------------------------------------------*/

/* A ZeroMQ client of type connected to ep: linger 0, receive timeout
 * rcvtimeo_ms, receive high-water mark rcvhwm (0 = libzmq's). A SUB is
 * subscribed to nothing yet. */
void *mt_zsock(void *ctx, int type, const char *ep, int rcvtimeo_ms,
               int rcvhwm);
/* A replay request to a DEALER connected to a publisher's ROUTER: every
 * buffered batch from seq start on, ["", start u64 BE]. */
void mt_replay_request(void *dealer, uint64_t start);
/* The u64 BE sequence number frame p (ck_assert that it is one). */
uint64_t mt_seq(const uint8_t *p, size_t n);
/* One multipart message from s, each frame malloc'd into fr[i] (len[i]);
 * returns the frame count (frames past max are counted, not kept), -1 on
 * a receive timeout. The caller frees fr[0 .. min(count, max)). */
int mt_recv_frames(void *s, uint8_t **fr, size_t *len, int max);
/* POST body to path on 127.0.0.1:port over a raw TCP connection, with
 * extra_headers ("Name: value\r\n" lines, or NULL) -- for what
 * kvo_http's client cannot do (custom headers, a request this thread does
 * not wait for). Returns the connected socket; the caller closes it. */
int mt_raw_post(uint16_t port, const char *path, const char *extra_headers,
                const char *body);

/* s with one test case ("mocker") of the given tests and timeout (seconds;
 * 0 = Check's default). Call it as mt_suite(suite_create("name"), ...):
 * CMake finds the suite's name in that literal. */
Suite *mt_suite(Suite *s, int timeout_s, const TTest *const *tests, size_t n);

#endif /* MT_H */
