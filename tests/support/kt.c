/* kt.c -- test support: paths, files, JSON, a real nats-server. */
#include "kt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = kvo_malloc(n);
    ck_assert_ptr_nonnull(p);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

char *kt_src_path(const char *rel) { return join(KVO_SOURCE_DIR, rel); }

char *kt_bin_path(const char *name) {
    char *dir = join(KVO_BINARY_DIR, "bin");
    char *p = join(dir, name);
    kvo_free(dir);
    return p;
}

uint8_t *kt_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    kvo_buf b;
    kvo_buf_init(&b);
    uint8_t tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
        ck_assert(kvo_buf_append(&b, tmp, n) == KVO_OK);
    fclose(f);
    *len = b.len;
    if (!b.data) b.data = kvo_malloc(1);
    return b.data;
}

json_object *kt_load_json(const char *rel) {
    char *path = kt_src_path(rel);
    json_object *j = json_object_from_file(path);
    ck_assert_msg(j != NULL, "cannot parse %s", path);
    kvo_free(path);
    return j;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

uint8_t *kt_unhex(const char *hex, size_t *len) {
    size_t n = strlen(hex);
    ck_assert_msg(n % 2 == 0, "odd hex length");
    uint8_t *out = kvo_malloc(n / 2 + 1);
    ck_assert_ptr_nonnull(out);
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        ck_assert_msg(hi >= 0 && lo >= 0, "bad hex");
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    *len = n / 2;
    return out;
}

char *kt_tmpdir(const char *tag) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char tmpl[512];
    snprintf(tmpl, sizeof(tmpl), "%s/kvo-test-%s-XXXXXX", base, tag);
    char *d = mkdtemp(tmpl);
    ck_assert_msg(d != NULL, "mkdtemp failed");
    return kvo_strdup(d);
}
