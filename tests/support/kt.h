/* kt.h -- test support shared by every test binary: paths to bundled data
 * and built executables, file and JSON loading, a real nats-server. */
#ifndef KT_H
#define KT_H

#include "kvo.h"
#include "kvo_proc.h"

#include <check.h>
#include <json-c/json.h>

/* Absolute path of a file in the source tree ("tests/data/vectors/...").
 * Returns a malloc'd string; the caller frees it. */
char *kt_src_path(const char *rel);
/* Absolute path of a built executable ("kvo-mocker"); malloc'd. */
char *kt_bin_path(const char *name);
/* Whole file; malloc'd; NULL (and a Check failure) when unreadable. */
uint8_t *kt_read_file(const char *path, size_t *len);
/* Parse a JSON file from the source tree; the caller puts it. */
json_object *kt_load_json(const char *rel);
/* Hex string -> malloc'd bytes. */
uint8_t *kt_unhex(const char *hex, size_t *len);
/* A fresh empty directory under $TMPDIR for one test; malloc'd path. */
char *kt_tmpdir(const char *tag);

/* A real nats-server on a free loopback port, started and stopped by the
 * test; its log is printed if a test fails while it runs. */
typedef struct kt_nats {
    kvo_proc proc;
    uint16_t port;
    char url[64];     /* nats://127.0.0.1:<port> */
    char dir[512];
} kt_nats;

/* Start (ck_assert on failure: nats-server missing, not ready in time). */
void kt_nats_start(kt_nats *n);
/* Stop and start again on the same port (for reconnect tests). */
void kt_nats_restart(kt_nats *n);
void kt_nats_stop(kt_nats *n);

#endif /* KT_H */
